package prefixcache

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/model"
)

func tinyConfig(t *testing.T) *model.Config {
	t.Helper()
	b, err := configs.ModelPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func toks(n, seed int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((seed*7919 + i*104729 + 13) % 256)
	}
	return out
}

func TestChain(t *testing.T) {
	salt := Salt("m", model.BF16)
	a := Chain(SHA256, salt, toks(200, 1))
	if len(a) != 3 {
		t.Fatalf("%d links for 200 tokens, want 3", len(a))
	}
	b := Chain(SHA256, salt, append(toks(128, 1), toks(64, 2)...))
	if a[0] != b[0] || a[1] != b[1] || a[2] == b[2] {
		t.Fatal("links must agree exactly on the shared blocks")
	}
	if c := Chain(SHA256, Salt("m", model.F32), toks(64, 1)); c[0] == a[0] {
		t.Fatal("another cache dtype gives the same link")
	}
	if c := Chain(SHA256, Salt("other", model.BF16), toks(64, 1)); c[0] == a[0] {
		t.Fatal("another model gives the same link")
	}
}

func TestSnapshots(t *testing.T) {
	for _, tc := range []struct {
		from, end, stride int
		want              []int
	}{
		{0, 149, 0, []int{128}},
		{0, 63, 0, nil},
		{128, 149, 0, nil}, // nothing new past the resumed prefix
		{128, 197, 0, []int{192}},
		{0, 300, 64, []int{64, 128, 192, 256}},
		{0, 300, 100, []int{128, 256}}, // rounded up to 128
		{130, 300, 128, []int{256}},
		{0, 1000, 512, []int{512, 960}},
	} {
		if got := Snapshots(tc.from, tc.end, tc.stride); !slices.Equal(got, tc.want) {
			t.Errorf("Snapshots(%d, %d, %d) = %v, want %v", tc.from, tc.end, tc.stride, got, tc.want)
		}
	}
	plan := []int{64, 128, 192}
	for pos, want := range map[int]int{0: 64, 64: 128, 100: 128, 192: 0, 500: 0} {
		if got := NextStop(plan, pos); got != want {
			t.Errorf("NextStop(%v, %d) = %d, want %d", plan, pos, got, want)
		}
	}
}

func TestVictim(t *testing.T) {
	es := map[uint64]*Entry{1: {ID: 1, used: 5}, 2: {ID: 2, used: 3}, 3: {ID: 3, used: 3}, 4: {ID: 4, used: 9}}
	for keep, want := range map[uint64]uint64{0: 2, 2: 3, 9: 2} {
		if got := Victim(es, keep); got != want {
			t.Errorf("Victim(keep %d) = %d, want %d", keep, got, want)
		}
	}
	if Victim(map[uint64]*Entry{7: {ID: 7}}, 7) != 0 {
		t.Error("the kept entry was chosen")
	}
}

// state is a whole-model state of n tokens whose every value names its
// token and layer, so a restored copy can be checked exactly.
func state(c *model.Config, n int, seed float32) *model.SeqState {
	st := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.F32, LatentCapacity: n + 10})
	for L, ls := range st.Layers {
		switch ls.Kind {
		case model.MLA:
			p := &ls.Parts[0]
			w := p.Shape[1]
			p.Data = p.Data[:n*w*4]
			p.Shape[0] = n
			for i, v := range p.F32() {
				p.F32()[i] = v + seed + float32(L*100000+i)
			}
		case model.KDA:
			for j := range ls.Parts {
				for i := range ls.Parts[j].F32() {
					ls.Parts[j].F32()[i] = seed + float32(n*1000+L*10+j)
				}
			}
		}
	}
	st.Tokens = n
	return st
}

func TestInsertLookupRestore(t *testing.T) {
	c := tinyConfig(t)
	budget := rank.NewBudget(0)
	pc := New(Config{Model: c, Lo: 0, Hi: c.NumLayers, DType: model.F32, Salt: Salt("m", model.F32), Budget: budget, Index: true})
	prompt := toks(200, 1)

	// A sequence planned to keep 64 and 192 snapshots at both.
	p := &Pending{ID: pc.NewID(), Plan: []int{64, 192}}
	s64 := state(c, 64, 0)
	pc.Snapshot(p, s64)
	pc.Snapshot(p, s64) // twice at one position: once
	pc.Snapshot(p, state(c, 100, 0))
	full := state(c, 199, 0) // its KDA parts differ from a 192 snapshot, rows do not
	pc.Snapshot(p, state(c, 192, 0))
	if !slices.Equal(p.Taken(), []int{64, 192}) {
		t.Fatalf("taken %v", p.Taken())
	}
	pc.Insert(p, full, prompt)
	st := pc.Stats()
	if st.Entries != 1 || st.Bytes != budget.Used() || st.Bytes == 0 {
		t.Fatalf("after insert: %+v, budget %d", st, budget.Used())
	}

	// The longest prefix with a snapshot: 192 for a longer prompt, 64 for
	// one that leaves at 150, none for another prompt or too short a limit.
	for _, tc := range []struct {
		q     []int32
		limit int
		pos   int
	}{
		{append(slices.Clone(prompt), 9, 9, 9), 202, 192},
		{prompt, 191, 64},
		{append(slices.Clone(prompt[:150]), toks(60, 5)...), 209, 64},
		{toks(200, 2), 199, 0},
		{prompt, 63, 0},
	} {
		id, pos := pc.Lookup(tc.q, tc.limit)
		if pos != tc.pos || (pos == 0) != (id == 0) {
			t.Errorf("lookup of %d tokens up to %d: entry %d at %d, want at %d", len(tc.q), tc.limit, id, pos, tc.pos)
		}
	}

	dst := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.F32, LatentCapacity: 300})
	if err := pc.Restore(dst, p.ID, 192); err != nil {
		t.Fatal(err)
	}
	want := state(c, 192, 0)
	a, _ := dst.MarshalBinary()
	b, _ := want.MarshalBinary()
	if !slices.Equal(a, b) {
		t.Fatal("restored state differs from the state at the snapshot")
	}
	dst2 := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.F32})
	if err := pc.Restore(dst2, p.ID, 100); !errors.Is(err, ErrMissing) {
		t.Fatalf("restore at a position without a snapshot: %v", err)
	}
	if err := pc.Restore(dst2, 99, 64); !errors.Is(err, ErrMissing) {
		t.Fatalf("restore of an unknown entry: %v", err)
	}
	if err := pc.Restore(dst, p.ID, 64); err == nil {
		t.Fatal("restored into a state that holds tokens")
	}

	// A continuation that used the whole entry supersedes it.
	q := &Pending{ID: pc.NewID(), Plan: []int{256}, From: p.ID, FromPos: 192}
	pc.Snapshot(q, state(c, 256, 0))
	pc.Insert(q, state(c, 260, 0), append(slices.Clone(prompt), toks(100, 3)...))
	l := pc.List()
	if len(l) != 1 || l[0].ID != q.ID || !slices.Equal(l[0].Snapshots, []int{64, 192, 256}) {
		t.Fatalf("after the continuation: %+v", l)
	}
	if id, pos := pc.Lookup(prompt, 199); id != q.ID || pos != 192 {
		t.Fatalf("the superseding entry serves the old prefix: %d at %d", id, pos)
	}
	if pc.Stats().Bytes != budget.Used() {
		t.Fatalf("accounting: cache %d, budget %d", pc.Stats().Bytes, budget.Used())
	}
	pc.Clear()
	if pc.Stats().Entries != 0 || budget.Used() != 0 || len(pc.index) != 0 {
		t.Fatalf("after clear: %+v, budget %d, index %d", pc.Stats(), budget.Used(), len(pc.index))
	}
}

// TestCollisions: with every link the same, lookups compare tokens and
// find only real prefixes.
func TestCollisions(t *testing.T) {
	c := tinyConfig(t)
	pc := New(Config{Model: c, Lo: 0, Hi: c.NumLayers, DType: model.F32, Hash: func(Hash, []int32) Hash { return 1 }, Index: true})
	for seed := range 3 {
		p := &Pending{ID: pc.NewID(), Plan: []int{128}}
		pc.Snapshot(p, state(c, 128, float32(seed)))
		pc.Insert(p, state(c, 128, float32(seed)), toks(128, seed))
	}
	for seed := range 3 {
		if id, pos := pc.Lookup(append(toks(128, seed), 1, 2), 129); id != uint64(seed+1) || pos != 128 {
			t.Errorf("prompt %d: entry %d at %d", seed, id, pos)
		}
	}
	if id, _ := pc.Lookup(toks(200, 7), 199); id != 0 {
		t.Errorf("a prompt of other tokens found entry %d", id)
	}
	// Another holder of the same tokens (hostile or not) cannot make a
	// lookup return tokens other than the prompt's.
	mixed := append(toks(64, 0), toks(64, 1)...)
	if id, _ := pc.Lookup(mixed, 128); id != 0 {
		t.Errorf("a mixed prompt found entry %d", id)
	}
}

// TestBudget: snapshots and entries draw on the rank's budget, evict the
// least recently used entries to fit, and are skipped when nothing can go.
func TestBudget(t *testing.T) {
	c := tinyConfig(t)
	entry := func(pc *Cache, seed int) *Pending {
		p := &Pending{ID: pc.NewID(), Plan: []int{128}}
		pc.Snapshot(p, state(c, 128, float32(seed)))
		pc.Insert(p, state(c, 130, float32(seed)), toks(130, seed))
		return p
	}
	free := New(Config{Model: c, Lo: 0, Hi: c.NumLayers, DType: model.F32, Index: true})
	entry(free, 0)
	one := free.Bytes()

	b := rank.NewBudget(2*one + one/2)
	pc := New(Config{Model: c, Lo: 0, Hi: c.NumLayers, DType: model.F32, Budget: b, Index: true})
	e1, e2 := entry(pc, 1), entry(pc, 2)
	if pc.Stats().Entries != 2 {
		t.Fatalf("%+v", pc.Stats())
	}
	if id, _ := pc.Lookup(append(toks(128, 1), 5), 129); id != e1.ID { // touches e1: e2 is now the LRU
		t.Fatalf("lookup: %d", id)
	}
	dst := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.F32, LatentCapacity: 200})
	if err := pc.Restore(dst, e1.ID, 128); err != nil {
		t.Fatal(err)
	}
	entry(pc, 3)
	st := pc.Stats()
	if st.Entries != 2 || st.Evictions != 1 || pc.entries[e2.ID] != nil || b.Used() > b.Limit() {
		t.Fatalf("after a third entry: %+v, e2 kept %v, budget %d of %d", st, pc.entries[e2.ID] != nil, b.Used(), b.Limit())
	}
	// A sequence's reservation of all the budget: every entry goes.
	for b.Reserve(b.Limit()) != nil {
		if _, ok := pc.EvictOne(0); !ok {
			t.Fatal("could not make room")
		}
	}
	if pc.Stats().Entries != 0 || pc.Bytes() != 0 {
		t.Fatalf("entries left: %+v", pc.Stats())
	}
	// A snapshot now fits nowhere: skipped, nothing held.
	p := &Pending{ID: pc.NewID(), Plan: []int{128}}
	pc.Snapshot(p, state(c, 128, 0))
	if len(p.Taken()) != 0 || pc.Stats().Skipped != 1 {
		t.Fatalf("a snapshot beyond the budget: taken %v, %+v", p.Taken(), pc.Stats())
	}
	pc.Insert(p, state(c, 130, 0), toks(130, 0)) // nothing to keep
	b.Release(b.Limit())
	if b.Used() != 0 || pc.Stats().Entries != 0 {
		t.Fatalf("budget %d, %+v", b.Used(), pc.Stats())
	}
}

// TestListDescribesEntries: a listing (what an operator sees) gives each
// entry its prefix's chain link at its length (only a cache with Index
// knows it) and when it was kept or last resumed from, the most recently
// used first.
func TestListDescribesEntries(t *testing.T) {
	c := tinyConfig(t)
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	var ticks time.Duration
	clock := func() time.Time { ticks += time.Second; return base.Add(ticks) }
	salt := Salt("m", model.F32)
	head := New(Config{Model: c, Lo: 0, Hi: c.NumLayers, DType: model.F32, Salt: salt, Index: true, Now: clock})
	member := New(Config{Model: c, Lo: 0, Hi: c.NumLayers, DType: model.F32, Salt: salt, Now: clock})
	a, b := toks(200, 1), toks(150, 2)
	for _, pc := range []*Cache{head, member} {
		for _, e := range []struct {
			id     uint64
			prompt []int32
			at     int
		}{{1, a, 192}, {2, b, 128}} {
			p := &Pending{ID: e.id, Plan: []int{e.at}}
			pc.Snapshot(p, state(c, e.at, 0))
			pc.Insert(p, state(c, len(e.prompt)-1, 0), e.prompt)
		}
	}
	chainA, chainB := Chain(SHA256, salt, a[:192]), Chain(SHA256, salt, b[:128])
	want := []Info{{ID: 2, Tokens: 128, LastUse: base.Add(2 * time.Second), Link: chainB[1]}, {ID: 1, Tokens: 192, LastUse: base.Add(time.Second), Link: chainA[2]}}
	check := func(pc *Cache, want []Info) {
		t.Helper()
		l := pc.List()
		if len(l) != len(want) {
			t.Fatalf("list %+v, want %+v", l, want)
		}
		for i := range want {
			if l[i].ID != want[i].ID || l[i].Tokens != want[i].Tokens || !l[i].LastUse.Equal(want[i].LastUse) || l[i].Link != want[i].Link || l[i].Bytes <= 0 {
				t.Fatalf("entry %d: %+v, want %+v", i, l[i], want[i])
			}
		}
	}
	check(head, want)
	rankWant := slices.Clone(want)
	for i := range rankWant {
		rankWant[i].Link = 0 // a rank keeps states, not the tokens they stand for
		rankWant[i].LastUse = rankWant[i].LastUse.Add(2 * time.Second)
	}
	check(member, rankWant)
	// Resuming from entry 1 makes it the most recently used, at that time.
	dst := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.F32, LatentCapacity: 300})
	if err := head.Restore(dst, 1, 192); err != nil {
		t.Fatal(err)
	}
	check(head, []Info{{ID: 1, Tokens: 192, LastUse: base.Add(5 * time.Second), Link: chainA[2]}, want[0]})
}
