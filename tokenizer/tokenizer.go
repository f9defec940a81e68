package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// File names inside a tokenizer directory.
const (
	ModelFile  = "tiktoken.model"
	ConfigFile = "tokenizer_config.json"
)

// Tokenizer encodes text to Kimi token ids and back. The first VocabSize()
// - NumSpecial ids are BPE ranks; the last NumSpecial are special tokens.
type Tokenizer struct {
	v *vocab

	specials  []string       // name of special id v.len()+i
	specialID map[string]int // name -> id
	specLens  []int          // distinct special name lengths, longest first
	specFirst [256]bool      // first bytes of special names
	longest   int            // bytes of the longest token's text, special names included
}

// Load reads a tokenizer from dir: tiktoken.model and tokenizer_config.json.
func Load(dir string) (*Tokenizer, error) {
	model, err := os.ReadFile(filepath.Join(dir, ModelFile))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	config, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(model, config, filepath.Join(dir, ModelFile), filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

// Parse builds a tokenizer from the contents of a tiktoken.model and a
// tokenizer_config.json.
func Parse(model, config []byte) (*Tokenizer, error) {
	t, err := parse(model, config, ModelFile, ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

func parse(model, config []byte, modelName, configName string) (*Tokenizer, error) {
	v, err := parseRanks(model, modelName)
	if err != nil {
		return nil, err
	}
	names, err := parseSpecials(config, v.len(), configName)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{v: v, specials: names, specialID: make(map[string]int, len(names))}
	lens := map[int]bool{}
	for i, n := range names {
		t.specialID[n] = v.len() + i
		lens[len(n)] = true
		t.specFirst[n[0]] = true
	}
	for l := range lens {
		t.specLens = append(t.specLens, l)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(t.specLens)))
	for r := range v.len() {
		t.longest = max(t.longest, len(v.bytes(r)))
	}
	if len(t.specLens) > 0 {
		t.longest = max(t.longest, t.specLens[0])
	}
	return t, nil
}

// MinTokens is a lower bound on the tokens that text of n bytes encodes
// to: no token covers more bytes than the longest one. It lets a prompt
// that is surely over a limit be refused without encoding it.
func (t *Tokenizer) MinTokens(n int) int {
	if t.longest == 0 {
		return n
	}
	return (n + t.longest - 1) / t.longest
}

// MinSegmentTokens is MinTokens over rendered segments: each special
// segment one token, the text segments by their bytes.
func (t *Tokenizer) MinSegmentTokens(segs []Segment) int {
	n, text := 0, 0
	for _, s := range segs {
		if s.Special {
			n++
		} else {
			text += len(s.Text)
		}
	}
	return n + t.MinTokens(text)
}

// VocabSize is the number of token ids: ranks plus special slots.
func (t *Tokenizer) VocabSize() int { return t.v.len() + NumSpecial }

// NumRanks is the number of mergeable (BPE) tokens; special ids start here.
func (t *Tokenizer) NumRanks() int { return t.v.len() }

// SpecialID returns the id of the special token with the given name.
func (t *Tokenizer) SpecialID(name string) (int, bool) {
	id, ok := t.specialID[name]
	return id, ok
}

// IsSpecial reports whether id is a special token.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= t.v.len() && id < t.VocabSize()
}

// appendToken appends the bytes of token id to dst. A special token's bytes
// are its name, as tiktoken decodes them.
func (t *Tokenizer) appendToken(dst []byte, id int) ([]byte, error) {
	switch {
	case id >= 0 && id < t.v.len():
		return append(dst, t.v.bytes(id)...), nil
	case t.IsSpecial(id):
		return append(dst, t.specials[id-t.v.len()]...), nil
	}
	return dst, fmt.Errorf("token id %d is outside the vocabulary [0, %d)", id, t.VocabSize())
}

// Decode returns the bytes of the tokens. The bytes need not be valid UTF-8:
// a token can end inside a character. Special tokens decode to their names.
func (t *Tokenizer) Decode(ids []int) ([]byte, error) {
	out := make([]byte, 0, 4*len(ids))
	for i, id := range ids {
		var err error
		if out, err = t.appendToken(out, id); err != nil {
			return nil, fmt.Errorf("tokenizer: decode: position %d: %w", i, err)
		}
	}
	return out, nil
}

// DecodeString returns the text of the tokens, with ill-formed UTF-8 replaced
// as ToValidUTF8 does. It equals everything a StreamDecoder hands out for the
// same tokens.
func (t *Tokenizer) DecodeString(ids []int) (string, error) {
	b, err := t.Decode(ids)
	if err != nil {
		return "", err
	}
	return ToValidUTF8(b), nil
}

// Encode returns the token ids of text as ordinary text: special-token names
// in it are encoded like any other text. Ill-formed UTF-8 is replaced first
// (see ToValidUTF8).
func (t *Tokenizer) Encode(text string) []int {
	e := newEncoder(t)
	kimiCuts.cut(toValidString(text), e.ordinary)
	return e.out
}

// EncodeWithSpecials is Encode, except that the names of the allowed special
// tokens are recognised in text and become their ids. With no names given,
// every special token is allowed.
func (t *Tokenizer) EncodeWithSpecials(text string, allowed ...string) ([]int, error) {
	var allow map[string]bool
	if len(allowed) > 0 {
		allow = make(map[string]bool, len(allowed))
		for _, n := range allowed {
			if _, ok := t.specialID[n]; !ok {
				return nil, fmt.Errorf("tokenizer: %q is not a special token", n)
			}
			allow[n] = true
		}
	}
	e := newEncoder(t)
	kimiCuts.cut(toValidString(text), func(piece string) {
		for len(piece) > 0 {
			at, id, n := t.nextSpecial(piece, allow)
			if at < 0 {
				e.ordinary(piece)
				return
			}
			e.ordinary(piece[:at])
			e.out = append(e.out, id)
			piece = piece[at+n:]
		}
	})
	return e.out, nil
}

// nextSpecial finds the leftmost allowed special token in s (all when allow
// is nil), the longest if several start at the same place. It returns its
// offset, id and length, or -1.
func (t *Tokenizer) nextSpecial(s string, allow map[string]bool) (at, id, n int) {
	for i := 0; i < len(s); i++ {
		if !t.specFirst[s[i]] {
			continue
		}
		for _, l := range t.specLens {
			if i+l > len(s) {
				continue
			}
			name := s[i : i+l]
			if id, ok := t.specialID[name]; ok && (allow == nil || allow[name]) {
				return i, id, l
			}
		}
	}
	return -1, 0, 0
}
