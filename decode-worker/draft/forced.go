package draft

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
)

// Forced is a drafter for benchmarks of the verify path at a chosen
// acceptance: it knows each prompt's continuation (the model's own greedy
// output, recorded by a run without drafts) and proposes it, each drafted
// token wrong with probability 1-Accept. Whether the token at a position is
// wrong is a pure function of the prompt and the position, so every run of
// the same workload drafts the same tokens. A wrong token is the right one
// plus one, modulo Vocab: never the model's choice, so greedy verification
// rejects exactly there.
type Forced struct {
	Accept float64 // probability that a drafted token is right
	Vocab  int32
	byLen  map[int]map[uint64]forcedEntry
	lens   []int // byLen's keys, longest first
}

type forcedEntry struct {
	prompt, cont []int32
}

// Add records that prompt continues with cont.
func (f *Forced) Add(prompt, cont []int32) error {
	if len(prompt) == 0 {
		return fmt.Errorf("draft: forced continuation for an empty prompt")
	}
	if f.byLen == nil {
		f.byLen = map[int]map[uint64]forcedEntry{}
	}
	m := f.byLen[len(prompt)]
	if m == nil {
		m = map[uint64]forcedEntry{}
		f.byLen[len(prompt)] = m
		f.lens = append(f.lens, len(prompt))
		slices.SortFunc(f.lens, func(a, b int) int { return b - a })
	}
	h := hashTokens(prompt)
	if e, ok := m[h]; ok && !slices.Equal(e.prompt, prompt) {
		return fmt.Errorf("draft: two forced prompts of %d tokens share a hash", len(prompt))
	}
	m[h] = forcedEntry{prompt: slices.Clone(prompt), cont: slices.Clone(cont)}
	return nil
}

// Draft implements Drafter: the recorded continuation after tokens, with
// planted errors.
func (f *Forced) Draft(tokens []int32, k int) []int32 {
	e, ok := f.find(tokens)
	if !ok || k < 1 {
		return nil
	}
	at := len(tokens) - len(e.prompt)
	if at >= len(e.cont) {
		return nil
	}
	out := slices.Clone(e.cont[at:min(len(e.cont), at+k)])
	ph := hashTokens(e.prompt)
	for i := range out {
		if !f.right(ph, at+i) {
			out[i] = (out[i] + 1) % max(f.Vocab, 1)
		}
	}
	return out
}

// find is the longest recorded prompt that tokens start with and whose
// continuation they follow so far.
func (f *Forced) find(tokens []int32) (forcedEntry, bool) {
	for _, n := range f.lens {
		m := f.byLen[n]
		if n > len(tokens) {
			continue
		}
		e, ok := m[hashTokens(tokens[:n])]
		if !ok || !slices.Equal(e.prompt, tokens[:n]) {
			continue
		}
		out := tokens[n:]
		if len(out) <= len(e.cont) && slices.Equal(out, e.cont[:len(out)]) {
			return e, true
		}
	}
	return forcedEntry{}, false
}

// right decides whether the draft of position at after the prompt hashed
// ph is the right token.
func (f *Forced) right(ph uint64, at int) bool {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], ph)
	binary.LittleEndian.PutUint64(b[8:], uint64(at))
	h := fnv.New64a()
	h.Write(b[:])
	u := float64(h.Sum64()>>11) / (1 << 53)
	return f.Accept >= 1 || u < f.Accept
}

func hashTokens(ts []int32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range ts {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	return h.Sum64()
}

// forcedLine is one line of a forced-drafts file (JSON Lines): a prompt's
// token ids and the model's output after it.
type forcedLine struct {
	Prompt []int32 `json:"prompt"`
	Output []int32 `json:"output"`
}

// ParseForced reads a forced-drafts file (one JSON object a line, with
// "prompt" and "output" token ids in [0, vocab)) for a Forced drafter
// at acceptance accept.
func ParseForced(data []byte, accept float64, vocab int32) (*Forced, error) {
	if accept < 0 || accept > 1 || accept != accept {
		return nil, fmt.Errorf("draft: forced acceptance %v: want a probability in [0, 1]", accept)
	}
	f := &Forced{Accept: accept, Vocab: vocab}
	for n, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l forcedLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("draft: forced drafts line %d: %w", n+1, err)
		}
		for _, id := range slices.Concat(l.Prompt, l.Output) {
			if id < 0 || id >= vocab {
				return nil, fmt.Errorf("draft: forced drafts line %d: token id %d is outside the vocabulary [0, %d)", n+1, id, vocab)
			}
		}
		if err := f.Add(l.Prompt, l.Output); err != nil {
			return nil, fmt.Errorf("draft: forced drafts line %d: %w", n+1, err)
		}
	}
	return f, nil
}
