package grammar

import (
	"bytes"
	"fmt"
	"slices"
)

// Markers are the ids of K3's structural special tokens.
type Markers struct {
	Open, Close, Sep, EndOfMsg int
}

// Symbols the automaton reads: the 256 bytes, then the markers.
const (
	symOpen = 256 + iota
	symClose
	symSep
	symEOM
	numSyms
)

// MaxVocab bounds a Vocabulary's size.
const MaxVocab = 1 << 22

// Vocabulary is a tokenizer's ids as the automaton reads them: each
// ordinary token its bytes, each marker its symbol; other special tokens
// are never allowed. It holds the tokens in a trie, laid out in preorder,
// so that a mask walks shared prefixes once. It is immutable and safe for
// concurrent use; build it once per tokenizer.
type Vocabulary struct {
	size    int
	markers [4]int32 // by symbol - 256
	// The trie in preorder; node 0 is the root. Node i's subtree is
	// [i, end[i]); its first child, if any, is i+1, and a child c's next
	// sibling is end[c].
	sym   []byte
	depth []uint16
	end   []int32
	id    []int32           // the token ending at the node, or -1
	dups  map[int32][]int32 // further ids with the same bytes, by node
	maxD  int
	bytes [][]byte // by id; nil for special tokens
}

// NewVocabulary builds a Vocabulary of size ids: bytesOf gives an ordinary
// token's bytes and nil for a special token; m names the markers.
func NewVocabulary(size int, bytesOf func(id int) []byte, m Markers) (*Vocabulary, error) {
	if size <= 0 || size > MaxVocab {
		return nil, fmt.Errorf("grammar: vocabulary of %d ids (at most %d)", size, MaxVocab)
	}
	v := &Vocabulary{size: size, bytes: make([][]byte, size), dups: map[int32][]int32{}}
	for i, id := range []int{m.Open, m.Close, m.Sep, m.EndOfMsg} {
		if id < 0 || id >= size {
			return nil, fmt.Errorf("grammar: marker id %d outside the vocabulary [0, %d)", id, size)
		}
		v.markers[i] = int32(id)
	}
	var ids []int32
	for id := 0; id < size; id++ {
		if slices.Contains(v.markers[:], int32(id)) {
			continue
		}
		b := bytesOf(id)
		if len(b) == 0 {
			continue
		}
		if len(b) > 1<<15 {
			return nil, fmt.Errorf("grammar: token %d has %d bytes", id, len(b))
		}
		v.bytes[id] = b
		ids = append(ids, int32(id))
	}
	slices.SortStableFunc(ids, func(a, b int32) int { return bytes.Compare(v.bytes[a], v.bytes[b]) })
	// Sorted order is the trie's preorder: each token adds the nodes past
	// its common prefix with the one before.
	v.sym, v.depth, v.end, v.id = []byte{0}, []uint16{0}, []int32{0}, []int32{-1}
	path := []int32{0} // node by depth along the current token
	var prev []byte
	for _, id := range ids {
		b := v.bytes[id]
		l := 0
		for l < len(prev) && l < len(b) && prev[l] == b[l] {
			l++
		}
		if l == len(b) && l == len(prev) { // same bytes as the one before
			n := path[l]
			v.dups[n] = append(v.dups[n], id)
			continue
		}
		for d := len(path) - 1; d > l; d-- { // close the subtrees left
			v.end[path[d]] = int32(len(v.sym))
		}
		path = path[:l+1]
		for d := l; d < len(b); d++ {
			n := int32(len(v.sym))
			v.sym = append(v.sym, b[d])
			v.depth = append(v.depth, uint16(d+1))
			v.end = append(v.end, 0)
			v.id = append(v.id, -1)
			path = append(path, n)
		}
		v.id[path[len(b)]] = id
		v.maxD = max(v.maxD, len(b))
		prev = b
	}
	for _, n := range path {
		v.end[n] = int32(len(v.sym))
	}
	return v, nil
}

// Size is the number of ids; a mask has MaskWords(Size) words.
func (v *Vocabulary) Size() int { return v.size }

// MaskWords is the number of uint64 words a mask of the vocabulary takes.
func (v *Vocabulary) MaskWords() int { return (v.size + 63) / 64 }

// Marker returns the id of a marker symbol.
func (v *Vocabulary) markerID(sym int) int32 { return v.markers[sym-256] }

// symbols returns id's symbols: its bytes, or its marker symbol; ok is
// false for an id the automaton never reads.
func (v *Vocabulary) symbols(id int, buf []int) ([]int, bool) {
	if id < 0 || id >= v.size {
		return nil, false
	}
	for i, m := range v.markers {
		if int(m) == id {
			return append(buf[:0], 256+i), true
		}
	}
	b := v.bytes[id]
	if b == nil {
		return nil, false
	}
	buf = buf[:0]
	for _, c := range b {
		buf = append(buf, int(c))
	}
	return buf, true
}

// Allowed reports whether bit id is set in mask.
func Allowed(mask []uint64, id int) bool {
	return id >= 0 && id/64 < len(mask) && mask[id/64]&(1<<(id%64)) != 0
}
