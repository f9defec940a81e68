package tokenizer

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
)

// vocab is the mergeable part of the vocabulary: the bytes of every rank,
// stored back to back in one string, and the reverse index, whose keys are
// substrings of that string (no allocation per token).
type vocab struct {
	blob string         // token bytes, rank after rank
	offs []int32        // rank r is blob[offs[r]:offs[r+1]]
	rank map[string]int // token bytes -> rank
}

func (v *vocab) len() int { return len(v.offs) - 1 }

func (v *vocab) bytes(r int) string { return v.blob[v.offs[r]:v.offs[r+1]] }

// parseRanks reads a tiktoken.model: lines "base64(token bytes) rank". Blank
// lines are skipped, as tiktoken does. The ranks must be 0..N-1, each once,
// each token distinct, and every single byte must have a rank, since
// byte-level BPE starts from bytes. name labels errors.
func parseRanks(data []byte, name string) (*vocab, error) {
	n := 0
	forLines(data, func(int, []byte) bool { n++; return true })
	if n == 0 {
		return nil, fmt.Errorf("%s: no ranks", name)
	}
	type entry struct {
		line     int
		off, end int32 // in fileBlob
	}
	entries := make([]entry, n)
	filled := make([]bool, n)
	fileBlob := make([]byte, 0, len(data)*3/4)
	var err error
	forLines(data, func(lineNo int, line []byte) bool {
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 || bytes.IndexByte(line[sp+1:], ' ') >= 0 {
			err = fmt.Errorf("%s:%d: want \"base64 rank\", got %q", name, lineNo, clip(line))
			return false
		}
		off := len(fileBlob)
		fileBlob, err = base64.StdEncoding.AppendDecode(fileBlob, line[:sp])
		if err != nil {
			err = fmt.Errorf("%s:%d: token %q is not base64: %w", name, lineNo, clip(line[:sp]), err)
			return false
		}
		if len(fileBlob) == off {
			err = fmt.Errorf("%s:%d: empty token", name, lineNo)
			return false
		}
		r, perr := strconv.Atoi(string(line[sp+1:]))
		switch {
		case perr != nil || r < 0:
			err = fmt.Errorf("%s:%d: rank %q is not a non-negative integer", name, lineNo, clip(line[sp+1:]))
		case r >= n:
			err = fmt.Errorf("%s:%d: rank %d leaves a gap: %d ranks must be 0..%d", name, lineNo, r, n, n-1)
		case filled[r]:
			err = fmt.Errorf("%s:%d: rank %d is also on line %d", name, lineNo, r, entries[r].line)
		}
		if err != nil {
			return false
		}
		filled[r] = true
		entries[r] = entry{lineNo, int32(off), int32(len(fileBlob))}
		return true
	})
	if err != nil {
		return nil, err
	}

	// Lay the tokens out in rank order (files are usually sorted already).
	blob := make([]byte, 0, len(fileBlob))
	offs := make([]int32, 1, n+1)
	for _, e := range entries {
		blob = append(blob, fileBlob[e.off:e.end]...)
		offs = append(offs, int32(len(blob)))
	}
	v := &vocab{blob: string(blob), offs: offs, rank: make(map[string]int, n)}
	for r := range n {
		tok := v.bytes(r)
		if prev, dup := v.rank[tok]; dup {
			return nil, fmt.Errorf("%s:%d: token %q (rank %d) is also rank %d on line %d", name, entries[r].line, tok, r, prev, entries[prev].line)
		}
		v.rank[tok] = r
	}
	for b := 0; b < 256; b++ {
		if _, ok := v.rank[string([]byte{byte(b)})]; !ok {
			return nil, fmt.Errorf("%s: no rank for the single byte 0x%02x; a byte-level BPE needs all 256", name, b)
		}
	}
	return v, nil
}

// forLines calls fn with each non-blank line of data (a trailing CR
// removed) and its 1-based number, until fn returns false.
func forLines(data []byte, fn func(lineNo int, line []byte) bool) {
	for lineNo := 1; len(data) > 0; lineNo++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if len(line) > 0 && !fn(lineNo, line) {
			return
		}
	}
}

// clip shortens p for an error message.
func clip(p []byte) []byte {
	if len(p) > 40 {
		return append(p[:37:37], "..."...)
	}
	return p
}
