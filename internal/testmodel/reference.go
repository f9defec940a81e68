package testmodel

import (
	"context"
	"testing"

	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// Reference is the whole model in one process, on the CPU backend: what
// every disaggregated path (a decode group, a remote prefill, the
// coordinator's jobs) must reproduce.
type Reference struct{ *model.Loaded }

// LoadReference loads dir with embedding and head on threads CPU threads
// (0: all), closed when the test ends.
func LoadReference(tb testing.TB, dir string, threads int) Reference {
	tb.Helper()
	m, err := model.Load(dir, cpu.New(threads), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return Reference{m}
}

// Greedy generates n tokens greedily after prompt.
func (r Reference) Greedy(tb testing.TB, prompt []int32, n int) []int32 {
	tb.Helper()
	out, err := r.Generate(context.Background(), prompt, n)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// RemoteState is the state the prefill worker computes for prompt[:-1]
// (the decode side runs the last token as its first step).
func (r Reference) RemoteState(tb testing.TB, prompt []int32) *model.SeqState {
	tb.Helper()
	st := r.NewState(0, r.Cfg.NumLayers)
	if len(prompt) > 1 {
		if err := r.PrefillState(context.Background(), []*model.SeqState{st}, [][]int32{prompt[:len(prompt)-1]}); err != nil {
			tb.Fatal(err)
		}
	}
	return st
}
