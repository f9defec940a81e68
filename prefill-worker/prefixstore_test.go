package main

import (
	"testing"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
)

// TestPrefixStoreKeyedByModelAndDType: the worker's prefix store, opened as
// the worker opens it from its settings (--model, --cache-dtype,
// --prefix-store-dir), keeps an entry only for the model identity and the
// cache dtype it was written with. A worker restarted on the same
// directory with another cache dtype or another checkpoint removes the
// entry when it opens the store (counted as invalidated), so no later
// worker resumes from it, not even one started again with the first
// settings; with the same settings the entry is found again.
func TestPrefixStoreKeyedByModelAndDType(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	other := testmodel.Dir(t, "small", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	storeDir := t.TempDir()
	open := func(model, dtype string) *prefixstore.Store {
		t.Helper()
		cfg, err := loadConfig([]string{"--model", model, "--cache-dtype", dtype, "--prefix-store-dir", storeDir})
		if err != nil {
			t.Fatal(err)
		}
		id, err := modelinfo.Identity(cfg.Model)
		if err != nil {
			t.Fatal(err)
		}
		st, err := openStore(cfg, id, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	p := make([]int32, 200)
	for i := range p {
		p[i] = int32((i*7919 + 5) % ref.Cfg.VocabSize)
	}
	// write keeps the state of p's first 128 tokens, as a job's sink does.
	write := func(st *prefixstore.Store) {
		t.Helper()
		state := ref.RemoteState(t, p[:129])
		w, err := st.Create(p[:128], "")
		if err != nil {
			t.Fatal(err)
		}
		for _, ls := range state.Layers {
			if err := w.Put(ls); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	hit := func(st *prefixstore.Store) int {
		t.Helper()
		h, err := st.Lookup(p, len(p), len(p))
		if err != nil {
			t.Fatal(err)
		}
		if h == nil {
			return 0
		}
		return h.Tokens
	}

	st := open(dir, "bf16")
	write(st)
	if got := hit(open(dir, "bf16")); got != 128 {
		t.Fatalf("reopened with the same settings: a hit of %d tokens, want 128", got)
	}
	for _, change := range []struct{ model, dtype, what string }{{dir, "f32", "another cache dtype"}, {other, "bf16", "another checkpoint"}} {
		st := open(change.model, change.dtype)
		if s := st.Stats(); s.Invalidated != 1 || s.Entries != 0 || s.Corrupt != 0 {
			t.Fatalf("%s: the store opened with %+v, want the old entry invalidated", change.what, s)
		}
		if change.model == dir {
			if got := hit(st); got != 0 {
				t.Fatalf("%s: resumed %d tokens from the old entry", change.what, got)
			}
		}
		back := open(dir, "bf16")
		if got := hit(back); got != 0 || back.Stats().Entries != 0 {
			t.Fatalf("after %s, the first settings again: a hit of %d tokens (%+v), want none", change.what, got, back.Stats())
		}
		write(back) // for the next change
	}
}
