// Package prefixkey names token prefixes for the prefix-state cache: a hash
// chain over fixed blocks of tokens, seeded by what makes a cached state
// valid (the model and the cache dtype). The decode ranks key their cache
// by it and advertise links of it in the registry; the coordinator computes
// the same chain over a prompt to see how much of it a group holds. It is
// a leaf: it knows tokens, not tensors.
package prefixkey

import (
	"crypto/sha256"
	"encoding/binary"
)

// Block is the token block a link covers: the KDA chunk (64 tokens), on
// whose grid the cache's snapshots lie.
const Block = 64

// Hash is one link of a prefix's hash chain.
type Hash uint64

// HashFunc chains one block of tokens onto the previous link.
type HashFunc func(prev Hash, block []int32) Hash

// SHA256 is the default chain: the first 8 bytes of SHA-256 over the
// previous link and the block's tokens (little-endian int32s).
func SHA256(prev Hash, block []int32) Hash {
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(prev))
	h.Write(b[:])
	buf := make([]byte, 4*len(block))
	for i, t := range block {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(t))
	}
	h.Write(buf)
	return Hash(binary.LittleEndian.Uint64(h.Sum(nil)))
}

// Salt seeds a chain with the model's identity and the MLA cache dtype (its
// code): a cache of another model or dtype computes other links, so nothing
// kept for the old one matches.
func Salt(modelID string, dtype uint8) Hash {
	h := sha256.Sum256(append([]byte(modelID+"\x00"), dtype))
	return Hash(binary.LittleEndian.Uint64(h[:8]))
}

// Chain returns the links of tokens' full blocks: out[i] covers
// tokens[:(i+1)*Block].
func Chain(f HashFunc, salt Hash, tokens []int32) []Hash {
	n := len(tokens) / Block
	out := make([]Hash, n)
	prev := salt
	for i := range n {
		prev = f(prev, tokens[i*Block:(i+1)*Block])
		out[i] = prev
	}
	return out
}

// Longest returns the length of the longest prefix of tokens, at most limit
// tokens, whose link is in held (links the holder advertised with the
// prefix lengths they stand for), or 0. A holder advertises only links it
// can resume from, and a link names its whole prefix, so this is what the
// holder would reuse, short of a hash collision (which the holder's own
// token comparison catches: the router then priced a hit that is not one).
func Longest(f HashFunc, salt Hash, tokens []int32, limit int, held map[Hash]int) int {
	limit = min(limit, len(tokens))
	chain := Chain(f, salt, tokens[:limit/Block*Block])
	for i := len(chain) - 1; i >= 0; i-- {
		if n, ok := held[chain[i]]; ok && n == (i+1)*Block {
			return n
		}
	}
	return 0
}

// Snapshots plans the positions at which a sequence's state is kept: every
// multiple of stride after from (the position it resumed at) and the last
// multiple of Block not after end (the prompt's prefilled end), in order.
// stride <= 0 keeps only the end; a stride that is not a multiple of Block
// is rounded up to one. A decode group's prefill steps end at these
// positions as well as at its chunk limit, so the router prices them too.
func Snapshots(from, end, stride int) []int {
	last := end / Block * Block
	if last <= from {
		return nil
	}
	var out []int
	if stride > 0 {
		stride = (stride + Block - 1) / Block * Block
		for p := (from/stride + 1) * stride; p < last; p += stride {
			out = append(out, p)
		}
	}
	return append(out, last)
}

// Image is an image's place in a prompt, for the keys: its pad run
// [At, At+Len) and the hash of its preprocessed pixels.
type Image struct {
	At, Len int
	Hash    [32]byte
}

// Fold returns the prompt as the cache keys see it: each image's pad run
// replaced by words of the image's hash. Two images of one size have the
// same pad ids, so without this a prompt about one image would resume from
// the state of a prompt about another. The words have the sign bit set, so
// they are never token ids (which are >= 0) and a folded prompt never
// matches a plain one; position k of a run takes word k mod 8, so a run of
// 8 rows or more carries the whole hash (31 bits of it a row). tokens is
// not changed; with no images it is returned as is. Runs outside tokens
// are cut to it.
func Fold(tokens []int32, imgs []Image) []int32 {
	if len(imgs) == 0 {
		return tokens
	}
	out := make([]int32, len(tokens))
	copy(out, tokens)
	for _, im := range imgs {
		for k := max(im.At, 0); k < min(im.At+im.Len, len(out)); k++ {
			j := (k - im.At) % 8
			out[k] = int32(binary.LittleEndian.Uint32(im.Hash[4*j:]) | 1<<31)
		}
	}
	return out
}
