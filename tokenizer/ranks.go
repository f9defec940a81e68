package tokenizer

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
)

// vocab is the mergeable part of the vocabulary: the bytes of every rank,
// stored back to back, and the reverse index.
type vocab struct {
	blob []byte         // token bytes, rank after rank
	offs []int32        // rank r is blob[offs[r]:offs[r+1]]
	rank map[string]int // token bytes -> rank
}

func (v *vocab) len() int { return len(v.offs) - 1 }

func (v *vocab) bytes(r int) []byte { return v.blob[v.offs[r]:v.offs[r+1]] }

// parseRanks reads a tiktoken.model: lines "base64(token bytes) rank". Blank
// lines are skipped, as tiktoken does. The ranks must be 0..N-1, each once,
// each token distinct, and every single byte must have a rank, since
// byte-level BPE starts from bytes. name labels errors.
func parseRanks(data []byte, name string) (*vocab, error) {
	type entry struct {
		line int
		tok  []byte
	}
	n := 0
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		if len(bytes.TrimRight(line, "\r")) > 0 {
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no ranks", name)
	}
	entries := make([]entry, n)
	filled := make([]bool, n)
	total := 0
	for i, line := range bytes.Split(data, []byte{'\n'}) {
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		lineNo := i + 1
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 || bytes.IndexByte(line[sp+1:], ' ') >= 0 {
			return nil, fmt.Errorf("%s:%d: want \"base64 rank\", got %q", name, lineNo, clip(line))
		}
		tok := make([]byte, base64.StdEncoding.DecodedLen(sp))
		k, err := base64.StdEncoding.Decode(tok, line[:sp])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: token %q is not base64: %w", name, lineNo, clip(line[:sp]), err)
		}
		if k == 0 {
			return nil, fmt.Errorf("%s:%d: empty token", name, lineNo)
		}
		r, err := strconv.Atoi(string(line[sp+1:]))
		if err != nil || r < 0 {
			return nil, fmt.Errorf("%s:%d: rank %q is not a non-negative integer", name, lineNo, clip(line[sp+1:]))
		}
		if r >= n {
			return nil, fmt.Errorf("%s:%d: rank %d leaves a gap: %d ranks must be 0..%d", name, lineNo, r, n, n-1)
		}
		if filled[r] {
			return nil, fmt.Errorf("%s:%d: rank %d is also on line %d", name, lineNo, r, entries[r].line)
		}
		filled[r] = true
		entries[r] = entry{lineNo, tok[:k]}
		total += k
	}
	v := &vocab{
		blob: make([]byte, 0, total),
		offs: make([]int32, 1, n+1),
		rank: make(map[string]int, n),
	}
	for r, e := range entries {
		if prev, dup := v.rank[string(e.tok)]; dup {
			return nil, fmt.Errorf("%s:%d: token %q (rank %d) is also rank %d on line %d", name, e.line, e.tok, r, prev, entries[prev].line)
		}
		v.blob = append(v.blob, e.tok...)
		v.offs = append(v.offs, int32(len(v.blob)))
		v.rank[string(e.tok)] = r
	}
	for b := 0; b < 256; b++ {
		if _, ok := v.rank[string([]byte{byte(b)})]; !ok {
			return nil, fmt.Errorf("%s: no rank for the single byte 0x%02x; a byte-level BPE needs all 256", name, b)
		}
	}
	return v, nil
}

// clip shortens p for an error message.
func clip(p []byte) []byte {
	if len(p) > 40 {
		return append(p[:37:37], "..."...)
	}
	return p
}
