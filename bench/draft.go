package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/draft"
	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
)

// Speculative decoding in the bench: generate --draft and decodegroup
// --forced-acceptance.

// parseDraftMode reads --draft: lookup or off.
func parseDraftMode(s string) (on bool, err error) {
	switch s {
	case "lookup":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("--draft %q: want lookup or off", s)
}

// forcedDrafter proposes the model's own continuation of each known prompt
// (the tokens a run without drafts emitted), each drafted token wrong (the
// next id) with probability 1-p, decided by a hash of the prompt and the
// position so that a run is reproducible. Until armed it drafts nothing.
type forcedDrafter struct {
	p     float64
	vocab int32
	armed atomic.Bool

	mu    sync.Mutex
	conts map[string][]int32 // by prompt
	plen  int
}

func (f *forcedDrafter) Draft(tokens []int32, k int) []int32 {
	if !f.armed.Load() || len(tokens) < f.plen {
		return nil
	}
	key := fmt.Sprint(tokens[:f.plen])
	f.mu.Lock()
	cont := f.conts[key]
	f.mu.Unlock()
	g := len(tokens) - f.plen
	if g >= len(cont) || !slices.Equal(tokens[f.plen:], cont[:g]) {
		return nil
	}
	d := slices.Clone(cont[g:min(g+k, len(cont))])
	for j := range d {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s/%d", key, g+j)
		if float64(h.Sum64()%1_000_000)/1e6 >= f.p {
			d[j] = (d[j] + 1) % f.vocab
		}
	}
	return d
}

// keep records the continuation a run without drafts gave a prompt.
func (f *forcedDrafter) keep(prompt, cont []int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conts[fmt.Sprint(prompt)] = slices.Clone(cont)
}

// forcedResult is one measurement of decodegroup --forced-acceptance.
type forcedResult struct {
	Ranks           int     `json:"ranks"`
	Seqs            int     `json:"seqs"`
	TokS            float64 `json:"tok_s"`
	TokSNoDraft     float64 `json:"tok_s_no_draft"`
	Ratio           float64 `json:"ratio"`
	Drafted         int64   `json:"drafted"`
	Accepted        int64   `json:"accepted"`
	Acceptance      float64 `json:"acceptance"` // measured: accepted / drafted
	TokensPerStep   float64 `json:"tokens_per_step"`
	AcceptedPerStep float64 `json:"accepted_per_step"`
	StepMs          float64 `json:"step_ms"`
	StepMsNoDraft   float64 `json:"step_ms_no_draft"`
}

// runForced measures, for each group size and sequence count, decode
// tok/s without drafts and then with a forced drafter of acceptance p, on
// the same group in the same run (the drafter drafts nothing until armed).
func runForced(ctx context.Context, mf *modelFlags, rs, ss []int, promptLen, tokens, micro int, p float64, asJSON bool) error {
	var out []forcedResult
	if !asJSON {
		fmt.Printf("| ranks | seqs | tok/s no draft | tok/s drafted (P=%.2f) | ratio | accepted/drafted | tokens/step | ms/step no draft | ms/step |\n", p)
		fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for _, r := range rs {
		opt, err := groupOptions(mf, r, 1)
		if err != nil {
			return err
		}
		opt.MicroBatches = micro
		fd := &forcedDrafter{p: p, conts: map[string][]int32{}, plen: promptLen}
		opt.Draft = pipeline.DraftConfig{Drafter: fd}
		g, err := group.Start(ctx, opt)
		if err != nil {
			return err
		}
		fd.vocab = int32(g.Model(0).Cfg.VocabSize)
		for _, s := range ss {
			res, err := forcedPair(ctx, g, fd, r, s, promptLen, tokens)
			if err != nil {
				g.Close()
				return fmt.Errorf("%d ranks, %d sequences: %w", r, s, err)
			}
			out = append(out, res)
			if !asJSON {
				fmt.Printf("| %d | %d | %.1f | %.1f | %.2fx | %.2f | %.2f | %.1f | %.1f |\n", r, s, res.TokSNoDraft, res.TokS, res.Ratio,
					res.Acceptance, res.TokensPerStep, res.StepMsNoDraft, res.StepMs)
			}
		}
		g.Close()
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"forced_acceptance": p, "prompt": promptLen, "tokens": tokens, "results": out})
	}
	return nil
}

// forcedRounds is how many times forcedPair alternates the two runs, so
// that a shared machine's load drifts over both alike.
const forcedRounds = 3

// forcedPair alternates no-draft runs (the first also records the
// continuations) and drafted runs of s sequences, forcedRounds of each,
// and sets their rates (all tokens over all time) side by side.
func forcedPair(ctx context.Context, g *group.Group, fd *forcedDrafter, r, s, promptLen, tokens int) (forcedResult, error) {
	var baseTime, draftTime, baseStep, draftStep time.Duration
	var after pipeline.Stats
	for i := range forcedRounds {
		fd.armed.Store(false)
		keep := fd.keep
		if i > 0 {
			keep = nil
		}
		base, err := measureDecodeKeep(ctx, g, s, promptLen, tokens, keep)
		if err != nil {
			return forcedResult{}, err
		}
		b := g.Head().Stats()
		fd.armed.Store(true)
		drafted, err := measureDecode(ctx, g, s, promptLen, tokens)
		fd.armed.Store(false)
		if err != nil {
			return forcedResult{}, err
		}
		a := g.Head().Stats()
		after.DraftedTokens += a.DraftedTokens - b.DraftedTokens
		after.AcceptedTokens += a.AcceptedTokens - b.AcceptedTokens
		after.DecodeRows += a.DecodeRows - b.DecodeRows
		baseTime += time.Duration(float64(s*tokens) / base.tokPerSec * float64(time.Second))
		draftTime += time.Duration(float64(s*tokens) / drafted.tokPerSec * float64(time.Second))
		baseStep += base.step
		draftStep += drafted.step
	}
	n := float64(forcedRounds * s * tokens)
	res := forcedResult{Ranks: r, Seqs: s, TokS: n / draftTime.Seconds(), TokSNoDraft: n / baseTime.Seconds(),
		Drafted: after.DraftedTokens, Accepted: after.AcceptedTokens,
		StepMs: durMS(draftStep) / forcedRounds, StepMsNoDraft: durMS(baseStep) / forcedRounds}
	res.Ratio = res.TokS / res.TokSNoDraft
	if res.Drafted > 0 {
		res.Acceptance = float64(res.Accepted) / float64(res.Drafted)
	}
	if rows := after.DecodeRows; rows > 0 {
		// Sequence steps: each emitted its accepted drafts and one token.
		res.TokensPerStep = n / float64(rows)
		res.AcceptedPerStep = float64(res.Accepted) / float64(rows)
	}
	return res, nil
}

var _ draft.Drafter = (*forcedDrafter)(nil)
