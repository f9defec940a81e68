package group

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
)

// waitCache waits until rank r's cache stats satisfy ok (the ranks keep
// entries when the head's Release reaches them, after the sink heard the
// end).
func (g *Group) waitCache(t *testing.T, r int, what string, ok func(prefixcache.Stats) bool) prefixcache.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := g.Worker(r).Stats().Cache
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank %d's cache: %s; it has %+v", r, what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sameEntries checks that every rank holds the same entries (ids, lengths
// and snapshot positions).
func (g *Group) sameEntries(t *testing.T) []prefixcache.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	strip := func(l []prefixcache.Info) []prefixcache.Info {
		out := slices.Clone(l)
		for i := range out {
			out[i].Bytes, out[i].LastUsed = 0, 0 // each rank holds its own layers' bytes
		}
		slices.SortFunc(out, func(a, b prefixcache.Info) int { return int(a.ID) - int(b.ID) })
		return out
	}
	head, err := g.Head().CacheEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for r := 1; r < len(g.Layout.Ranks); r++ {
		l, err := g.Worker(r).CacheEntries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(strip(head), strip(l), func(a, b prefixcache.Info) bool {
			return a.ID == b.ID && a.Tokens == b.Tokens && slices.Equal(a.Snapshots, b.Snapshots)
		}) {
			t.Fatalf("rank %d caches %+v, the head %+v", r, l, head)
		}
	}
	return head
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestPrefixCacheContinuation: three turns of a session, each prompt the
// previous one plus its reply plus new tokens, on groups of 1 and 3 ranks:
// each turn resumes from the previous turn's cached prompt (the longest
// multiple of 64 of its prefilled part), prefills only the rest, and gives
// exactly the greedy ids of a from-scratch run of its whole prompt (the
// monolithic reference, and a group with the cache off). A turn's entry
// supersedes the one it used whole, and every rank holds the same entries.
func TestPrefixCacheContinuation(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 8
	p1 := testkit.Prompt(150, vocab, 1)
	out1 := ref.Greedy(t, p1, n)
	p2 := concat(p1, out1, testkit.Prompt(40, vocab, 2))
	out2 := ref.Greedy(t, p2, n)
	p3 := concat(p2, out2, testkit.Prompt(70, vocab, 3))
	out3 := ref.Greedy(t, p3, n)
	turns := []struct {
		p, want []int32
		hit     int64 // tokens taken from the cache
	}{{p1, out1, 0}, {p2, out2, 128}, {p3, out3, 192}}

	for _, ranks := range []int{1, 3} {
		t.Run(name("ranks%d", ranks), func(t *testing.T) {
			opt := fastOpts(dir, ranks)
			opt.PrefillChunk = 64
			g := startGroup(t, opt)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var hits int64
			for i, tc := range turns {
				got, err := g.Generate(ctx, name("turn%d", i), tc.p, n)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tc.want) {
					t.Fatalf("turn %d (%d tokens, %d from the cache): %v\nfrom scratch: %v", i, len(tc.p), tc.hit, got, tc.want)
				}
				hits += tc.hit
				g.waitCache(t, 0, "hit tokens", func(s prefixcache.Stats) bool { return s.HitTokens == hits })
				for r := range ranks {
					// One entry: each turn's supersedes the one it resumed from.
					g.waitCache(t, r, "one entry", func(s prefixcache.Stats) bool { return s.Inserts == int64(i+1) && s.Entries == 1 })
				}
				l := g.sameEntries(t)
				if want := (len(tc.p) - 1) / 64 * 64; len(l) != 1 || l[0].Tokens != want {
					t.Fatalf("after turn %d: entries %+v, want one of %d tokens", i, l, want)
				}
				// What the head advertises finds the prefix the next turn
				// resumes from, as a router computes it.
				if i+1 < len(turns) {
					next := turns[i+1]
					st := g.Head().Stats()
					for deadline := time.Now().Add(10 * time.Second); len(st.CacheLinks) == 0 || st.Cache.Inserts != int64(i+1); st = g.Head().Stats() {
						if time.Now().After(deadline) {
							t.Fatalf("the head advertises no prefix: %+v", st.Cache)
						}
						time.Sleep(time.Millisecond)
					}
					held := map[prefixkey.Hash]int{}
					for _, l := range st.CacheLinks {
						held[l.Hash] = l.Tokens
					}
					if got := prefixkey.Longest(prefixkey.SHA256, st.CacheSalt, next.p, len(next.p)-1, held); int64(got) != next.hit {
						t.Fatalf("after turn %d the advertised prefixes %v price a hit of %d tokens for the next turn, it will hit %d", i, st.CacheLinks, got, next.hit)
					}
				}
			}
			g.checkFreed(t)
			if st := g.Head().Stats().Cache; st.Lookups != 3 || st.Hits != 2 || st.Misses != 1 {
				t.Fatalf("head's cache counters: %+v", st)
			}
		})
	}

	t.Run("cache off", func(t *testing.T) {
		opt := fastOpts(dir, 2)
		opt.PrefixCache.Off = true
		g := startGroup(t, opt)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for i, tc := range turns {
			got, err := g.Generate(ctx, name("turn%d", i), tc.p, n)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("turn %d with the cache off: %v %v, want %v", i, got, err, tc.want)
			}
		}
		if st := g.Head().Stats().Cache; st != (prefixcache.Stats{}) {
			t.Fatalf("cache off, yet %+v", st)
		}
	})
}

// TestPrefixCacheSharedSystemPrompt: with a snapshot every 64 tokens, four
// sessions submitted at once after a first one, all starting with the same
// 130-token system prompt and then going their own ways, each resume from
// the system prompt's 128 cached tokens and give their from-scratch ids.
func TestPrefixCacheSharedSystemPrompt(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 6
	sys := testkit.Prompt(130, vocab, 7)
	opt := fastOpts(dir, 2)
	opt.PrefillChunk = 128
	opt.PrefixCache.Stride = 64
	g := startGroup(t, opt)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	first := concat(sys, testkit.Prompt(20, vocab, 100))
	if got, err := g.Generate(ctx, "first", first, n); err != nil || !slices.Equal(got, ref.Greedy(t, first, n)) {
		t.Fatalf("first session: %v %v", got, err)
	}
	g.waitCache(t, 1, "the first session's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
	if l := g.sameEntries(t); len(l) != 1 || !slices.Equal(l[0].Snapshots, []int{64, 128}) {
		t.Fatalf("first session's entry: %+v", l)
	}

	c := NewCollector()
	prompts := make([][]int32, 4)
	errs := make(chan error, len(prompts))
	for i := range prompts {
		prompts[i] = concat(sys, testkit.Prompt(80+i, vocab, 200+i))
		go func() {
			errs <- g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: prompts[i], MaxTokens: n, Sink: c})
		}()
	}
	for range prompts {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range prompts {
		got, res, err := c.Wait(ctx, name("s%d", i))
		if err != nil || res.Err != nil {
			t.Fatalf("s%d: %v %v", i, err, res.Err)
		}
		if want := ref.Greedy(t, p, n); !slices.Equal(got, want) {
			t.Fatalf("s%d: %v, from scratch %v", i, got, want)
		}
	}
	st := g.waitCache(t, 0, "four hits", func(s prefixcache.Stats) bool { return s.Hits == 4 })
	if st.HitTokens != 4*128 {
		t.Fatalf("hit tokens %d, want %d", st.HitTokens, 4*128)
	}
	g.waitCache(t, 1, "every session's entry", func(s prefixcache.Stats) bool { return s.Inserts == 5 })
	g.sameEntries(t)
	g.checkFreed(t)
}

// TestPrefixCacheEviction: in a budget that holds one cached prompt besides
// a running sequence, a sequence that needs the room is admitted after the
// least recently used entry is evicted on every rank (never refused while
// entries could go), the cached bytes stay inside the budget, and the
// evicted prompt, asked again, runs from scratch with the same ids.
func TestPrefixCacheEviction(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 8
	ranges, err := rank.Split(ref.Cfg.NumLayers, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Room for b (288 tokens) and a snapshot of its KDA states, but not
	// also for a's entry (192 rows and a snapshot) on any rank.
	bytes := func(rg [2]int, tokens int) int64 { return rank.StateBytes(ref.Cfg, rg[0], rg[1], tokens, model.BF16) }
	var budget int64
	for _, rg := range ranges {
		budget = max(budget, bytes(rg, 288)+bytes(rg, 0))
	}
	for _, rg := range ranges {
		if budget >= bytes(rg, 192)+bytes(rg, 288) {
			t.Fatalf("layers %v: a budget of %d holds both a's entry and b", rg, budget)
		}
	}
	opt := fastOpts(dir, 2)
	opt.MemoryBudget = budget
	g := startGroup(t, opt)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	a := testkit.Prompt(200, vocab, 11)
	b := testkit.Prompt(280, vocab, 12)
	for _, tc := range []struct {
		id string
		p  []int32
	}{{"a", a}, {"b", b}, {"a-again", a}} {
		got, err := g.Generate(ctx, tc.id, tc.p, n)
		if err != nil {
			t.Fatalf("%s: %v", tc.id, err)
		}
		if want := ref.Greedy(t, tc.p, n); !slices.Equal(got, want) {
			t.Fatalf("%s: %v, from scratch %v", tc.id, got, want)
		}
		if tc.id == "a" {
			for r := range 2 {
				g.waitCache(t, r, "a's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
			}
		}
	}
	// The head evicts first and its Admit tells rank 1 to drop the same.
	if st := g.Head().Stats().Cache; st.Evictions < 1 {
		t.Fatalf("head evicted nothing: %+v", st)
	}
	for r := range 2 {
		st := g.waitCache(t, r, "the last entry", func(s prefixcache.Stats) bool { return s.Inserts == 3 && s.Entries == 1 })
		if st.Bytes > budget {
			t.Fatalf("rank %d caches %d bytes in a budget of %d", r, st.Bytes, budget)
		}
	}
	if st := g.Head().Stats(); st.Refused != 0 || st.Cache.Hits != 0 {
		t.Fatalf("refused %d, hits %d: a and b do not share a prefix, and a was evicted for b", st.Refused, st.Cache.Hits)
	}
	g.sameEntries(t)
	g.checkFreed(t)
}

// TestPrefixCacheRankRestart: a rank that restarts has lost its cache; the
// group forms a new ring with every rank's cache emptied, and the next turn
// runs from scratch with the same ids, then caches again.
func TestPrefixCacheRankRestart(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 6
	g := startGroup(t, fastOpts(dir, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p1 := testkit.Prompt(140, vocab, 21)
	out1, err := g.Generate(ctx, "t1", p1, n)
	if err != nil {
		t.Fatal(err)
	}
	g.waitCache(t, 2, "t1's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
	g.Stop(1)
	for _, r := range []int{0, 2} {
		g.waitCache(t, r, "emptied by the reset", func(s prefixcache.Stats) bool { return s.Entries == 0 && s.Bytes == 0 })
	}
	if err := g.Restart(1); err != nil {
		t.Fatal(err)
	}
	if err := g.Head().WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	p2 := concat(p1, out1, testkit.Prompt(30, vocab, 22))
	got, err := g.Generate(ctx, "t2", p2, n)
	if err != nil {
		t.Fatal(err)
	}
	if want := ref.Greedy(t, p2, n); !slices.Equal(got, want) {
		t.Fatalf("after the restart: %v, from scratch %v", got, want)
	}
	if st := g.Head().Stats().Cache; st.Hits != 0 {
		t.Fatalf("a hit after a rank lost its cache: %+v", st)
	}
	for r := range 3 {
		g.waitCache(t, r, "t2's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
	}
	g.sameEntries(t)
	g.checkFreed(t)
}

// TestPrefixCacheCollidingHashes: with a hash that maps every block to the
// same link, a prompt with other tokens is not taken for a cached one (the
// tokens are compared), while a real continuation still hits; and a rank
// that lost the entry the head chose (dropped by an operator) makes the
// head admit the sequence again without the cache, with the same ids.
func TestPrefixCacheCollidingHashes(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 6
	opt := fastOpts(dir, 3)
	opt.PrefixCache.Hash = func(prefixcache.Hash, []int32) prefixcache.Hash { return 42 }
	g := startGroup(t, opt)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := testkit.Prompt(150, vocab, 31)
	other := testkit.Prompt(150, vocab, 32)
	cont := concat(a, testkit.Prompt(60, vocab, 33))
	run := func(id string, p []int32) {
		t.Helper()
		got, err := g.Generate(ctx, id, p, n)
		if err != nil {
			t.Fatal(err)
		}
		if want := ref.Greedy(t, p, n); !slices.Equal(got, want) {
			t.Fatalf("%s: %v, from scratch %v", id, got, want)
		}
	}
	run("a", a)
	g.waitCache(t, 2, "a's entry", func(s prefixcache.Stats) bool { return s.Inserts == 1 })
	run("other", other)
	if st := g.Head().Stats().Cache; st.Hits != 0 {
		t.Fatalf("a colliding prompt was taken for a cached one: %+v", st)
	}
	g.waitCache(t, 2, "other's entry", func(s prefixcache.Stats) bool { return s.Inserts == 2 })
	run("cont", cont)
	if st := g.waitCache(t, 0, "one hit", func(s prefixcache.Stats) bool { return s.Hits == 1 }); st.HitTokens != 128 {
		t.Fatalf("continuation: %+v", st)
	}
	g.waitCache(t, 2, "cont's entry", func(s prefixcache.Stats) bool { return s.Inserts == 3 })
	g.sameEntries(t)

	// The last rank loses every entry; the head still believes in them.
	if _, err := g.Worker(2).DropCache(ctx, 0); err != nil {
		t.Fatal(err)
	}
	cont2 := concat(cont, testkit.Prompt(10, vocab, 34))
	run("cont2", cont2)
	if st := g.waitCache(t, 0, "a second hit", func(s prefixcache.Stats) bool { return s.Hits == 2 }); st.Misses != 2 {
		t.Fatalf("head's counters after a rank missed: %+v", st)
	}
	if st := g.Worker(2).Stats().Cache; st.Misses != 1 {
		t.Fatalf("last rank's counters: %+v", st)
	}
	if st := g.Head().Stats(); st.Refused != 0 {
		t.Fatalf("%d refused", st.Refused)
	}
	g.checkFreed(t)
	// The retry told every rank to drop the entry the last one lacked, and
	// every rank keeps the retried sequence's entry.
	g.waitCache(t, 2, "cont2's entry", func(s prefixcache.Stats) bool { return s.Inserts == 4 })
	var kept uint64
	for r := range 3 {
		l, err := g.Worker(r).CacheEntries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]uint64, len(l))
		for i, e := range l {
			ids[i] = e.ID
		}
		if r == 0 {
			kept = ids[0] // the most recently used: cont2's
		}
		if !slices.Contains(ids, kept) || slices.Contains(ids, kept-1) || l[0].Tokens != 192 {
			t.Fatalf("rank %d caches %+v: want cont2's entry %d, and not cont's (%d)", r, l, kept, kept-1)
		}
	}
	if n, err := g.Worker(1).DropCache(ctx, 9999); err != nil || n != 0 {
		t.Fatalf("dropping an unknown entry: %d %v", n, err)
	}
}

// TestPrefixCachePaused: while the head pauses the cache, a continuation
// runs from scratch and nothing new is kept; resumed, it hits again.
func TestPrefixCachePaused(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	g := startGroup(t, fastOpts(dir, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p1 := testkit.Prompt(140, vocab, 41)
	p2 := concat(p1, testkit.Prompt(20, vocab, 42))
	if _, err := g.Generate(ctx, "t1", p1, 4); err != nil {
		t.Fatal(err)
	}
	g.waitCache(t, 1, "t1's entry", func(s prefixcache.Stats) bool { return s.Inserts == 1 })
	if err := g.Head().SetPrefixCache(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := g.Worker(1).SetPrefixCache(ctx, false); err == nil {
		t.Fatal("rank 1 switched the cache")
	}
	for _, id := range []string{"paused", "resumed"} {
		got, err := g.Generate(ctx, id, p2, 4)
		if err != nil || !slices.Equal(got, ref.Greedy(t, p2, 4)) {
			t.Fatalf("%s: %v %v", id, got, err)
		}
		g.checkFreed(t) // every rank took the Release: what it keeps is settled
		st := g.Worker(1).Stats().Cache
		hits := g.Head().Stats().Cache.Hits
		if id == "paused" && (hits != 0 || st.Inserts != 1) || id == "resumed" && (hits != 1 || st.Inserts != 1) {
			t.Fatalf("%s: %d hits, %+v on rank 1", id, hits, st)
		}
		if err := g.Head().SetPrefixCache(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	g.checkFreed(t)
}

// TestPrefixCacheKeyedByModelAndDType: a group's cache is keyed by the
// model identity and the MLA cache dtype its ranks were started with. The
// ranks are restarted one by one with another model identity, then with
// another cache dtype, as an operator rolls out a new checkpoint or
// --cache-dtype: the head that outlives its peers' restart loses its
// entries with the ring (no rank keeps a state of the old model or
// dtype), the restarted head advertises its new key's seed, no turn
// resumes from an entry of the old key (the continuation of a cached
// session prefills from scratch and gives the from-scratch ids of the
// dtype it runs), and the next turn hits under the new key.
func TestPrefixCacheKeyedByModelAndDType(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	ref32 := testmodel.LoadReference(t, dir, 0)
	ref32.State.LatentDType = model.F32
	vocab := ref.Cfg.VocabSize
	const n = 6
	opt := fastOpts(dir, 2)
	opt.PrefixCache.ModelID = "model-a"
	g := startGroup(t, opt)
	ctx := testctx.Context(t)
	advertises := func(salt prefixkey.Hash, tokens []int32) bool {
		st := g.Head().Stats()
		link := prefixkey.Chain(prefixkey.SHA256, salt, tokens)[len(tokens)/prefixcache.Block-1]
		return st.CacheSalt == salt && slices.Contains(st.CacheLinks, prefixcache.Link{Hash: link, Tokens: len(tokens)})
	}
	p := testkit.Prompt(140, vocab, 41)
	out, err := g.Generate(ctx, "a-1", p, n)
	if err != nil || !slices.Equal(out, ref.Greedy(t, p, n)) {
		t.Fatalf("model-a: %v, %v; want %v", out, err, ref.Greedy(t, p, n))
	}
	for r := range 2 {
		g.waitCache(t, r, "the first turn's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
	}
	oldSalt := prefixkey.Salt("model-a", uint8(model.BF16))
	if !advertises(oldSalt, p[:128]) {
		t.Fatalf("the head advertises %x %v, want the first turn's 128 tokens under model-a's bf16 seed", g.Head().Stats().CacheSalt, g.Head().Stats().CacheLinks)
	}
	for i, step := range []struct {
		modelID string
		dtype   model.DType
		ref     testmodel.Reference
	}{{"model-b", model.BF16, ref}, {"model-b", model.F32, ref32}} {
		change := func(c *pipeline.Config) {
			c.PrefixCache.ModelID = step.modelID
			c.Model.State.LatentDType = step.dtype
		}
		g.Stop(1)
		g.waitCache(t, 0, "the head's entries gone with the ring", func(s prefixcache.Stats) bool { return s.Entries == 0 && s.Bytes == 0 })
		if err := g.RestartWith(1, change); err != nil {
			t.Fatal(err)
		}
		g.Stop(0)
		if err := g.RestartWith(0, change); err != nil {
			t.Fatal(err)
		}
		if err := g.Head().WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		salt := prefixkey.Salt(step.modelID, uint8(step.dtype))
		// The session's next turn: no rank holds its history any more.
		p = concat(p, out, testkit.Prompt(40, vocab, 42+i))
		out, err = g.Generate(ctx, fmt.Sprintf("step%d-1", i), p, n)
		if want := step.ref.Greedy(t, p, n); err != nil || !slices.Equal(out, want) {
			t.Fatalf("%s %s after the restart: %v, %v; want %v (from scratch)", step.modelID, step.dtype, out, err, want)
		}
		if st := g.Head().Stats().Cache; st.Hits != 0 || st.HitTokens != 0 {
			t.Fatalf("%s %s: a hit after the restart: %+v", step.modelID, step.dtype, st)
		}
		for r := range 2 {
			g.waitCache(t, r, "the turn's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
		}
		at := len(p) / prefixcache.Block * prefixcache.Block
		if at == len(p) {
			at -= prefixcache.Block
		}
		if !advertises(salt, p[:at]) || advertises(oldSalt, p[:at]) {
			t.Fatalf("%s %s: the head advertises %x %v, want the turn's %d tokens under the new seed %x only",
				step.modelID, step.dtype, g.Head().Stats().CacheSalt, g.Head().Stats().CacheLinks, at, salt)
		}
		// The cache works under the new key.
		p = concat(p, out, testkit.Prompt(30, vocab, 52+i))
		out, err = g.Generate(ctx, fmt.Sprintf("step%d-2", i), p, n)
		if want := step.ref.Greedy(t, p, n); err != nil || !slices.Equal(out, want) {
			t.Fatalf("%s %s, next turn: %v, %v; want %v", step.modelID, step.dtype, out, err, want)
		}
		if st := g.Head().Stats().Cache; st.Hits != 1 || st.HitTokens != int64(at) {
			t.Fatalf("%s %s, next turn: %+v, want one hit of %d tokens", step.modelID, step.dtype, st, at)
		}
		for r := range 2 {
			g.waitCache(t, r, "the next turn's entry", func(s prefixcache.Stats) bool { return s.Entries == 1 })
		}
		g.sameEntries(t)
		oldSalt = salt
	}
	g.checkFreed(t)
}
