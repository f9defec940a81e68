package group

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// forced is a test drafter that knows each prompt's continuation and
// proposes it with one planted error, at a position that moves from draft
// to draft of a sequence (every position in turn, then no error), so that
// every accepted count is exercised.
type forced struct {
	prompts, conts [][]int32
	vocab          int32

	mu    sync.Mutex
	calls map[int]int // drafts made, by prompt
}

func (f *forced) Draft(tokens []int32, k int) []int32 {
	for i, p := range f.prompts {
		if len(tokens) < len(p) || !slices.Equal(tokens[:len(p)], p) {
			continue
		}
		g := len(tokens) - len(p)
		if !slices.Equal(tokens[len(p):], f.conts[i][:min(g, len(f.conts[i]))]) || g >= len(f.conts[i]) {
			return nil
		}
		d := slices.Clone(f.conts[i][g:min(g+k, len(f.conts[i]))])
		f.mu.Lock()
		if f.calls == nil {
			f.calls = map[int]int{}
		}
		e := f.calls[i] % (k + 1)
		f.calls[i]++
		f.mu.Unlock()
		if e < len(d) {
			d[e] = (d[e] + 1) % f.vocab
		}
		return d
	}
	return nil
}

// speculationPrompts are prompts of several lengths (one past a KDA chunk)
// and one that repeats itself, so that prompt lookup finds drafts.
func speculationPrompts(vocab int) [][]int32 {
	rep := testkit.Prompt(12, vocab, 7)
	rep = append(append(append(rep, rep...), rep...), rep[:5]...)
	return [][]int32{testkit.Prompt(1, vocab, 1), testkit.Prompt(9, vocab, 2), testkit.Prompt(65, vocab, 3), rep}
}

// TestDraftsKeepGreedyIDs: with speculative decoding, groups of 1, 2 and 3
// ranks give the monolithic model's greedy ids, with the real lookup
// drafters and with a forced drafter whose drafts carry planted errors at
// every position; drafts were verified and both accepted and rejected.
func TestDraftsKeepGreedyIDs(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	const n = 24
	prompts := speculationPrompts(ref.Cfg.VocabSize)
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i] = ref.Greedy(t, p, n)
	}
	for ranks := 1; ranks <= 3; ranks++ {
		for _, mode := range []string{"lookup", "forced"} {
			t.Run(fmt.Sprintf("ranks%d/%s", ranks, mode), func(t *testing.T) {
				opt := fastOpts(dir, ranks)
				opt.Draft = pipeline.DraftConfig{Fixed: true, KMax: 4}
				if mode == "forced" {
					opt.Draft.Drafter = &forced{prompts: prompts, conts: want, vocab: int32(ref.Cfg.VocabSize)}
				}
				g := startGroup(t, opt)
				ctx := testctx.Context(t)
				c := NewCollector()
				for i, p := range prompts {
					if err := g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: p, MaxTokens: n, Sink: c}); err != nil {
						t.Fatal(err)
					}
				}
				for i := range prompts {
					got, res, err := c.Wait(ctx, name("s%d", i))
					if err != nil || res.Reason != pipeline.ReasonLength {
						t.Fatalf("s%d: %v, %+v", i, err, res)
					}
					if !slices.Equal(got, want[i]) {
						t.Fatalf("s%d: %v\nmonolithic: %v", i, got, want[i])
					}
				}
				st := g.Head().Stats()
				t.Logf("drafted %d, accepted %d in %d verifications, runs by accepted count %v; %d tokens in %d decode steps",
					st.DraftedTokens, st.AcceptedTokens, st.VerifiedSteps, st.AcceptedRuns, st.Tokens, st.DecodeSteps)
				if st.DraftedTokens == 0 {
					t.Fatal("nothing was drafted: the check proves nothing")
				}
				if mode == "forced" {
					for a := 0; a <= 4; a++ {
						if a >= len(st.AcceptedRuns) || st.AcceptedRuns[a] == 0 {
							t.Fatalf("no verification accepted %d drafts: %v", a, st.AcceptedRuns)
						}
					}
				}
				g.checkFreed(t)
			})
		}
	}
}

// TestDraftsKeepSampledTokens: seeded sampling with drafts (forced, with
// planted errors) gives the tokens the monolithic model draws with the same
// sampler one at a time: the verification consumes the sampler's stream as
// plain decoding does (sampling's own tests check the rule's distribution
// with a chi-square test).
func TestDraftsKeepSampledTokens(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	const n = 20
	params := []sampling.Params{{Temperature: 0.8, Seed: 1}, {Temperature: 1.2, TopK: 20, Seed: 2}, {Temperature: 0.7, TopP: 0.9, Seed: 3}}
	p := testkit.Prompt(7, ref.Cfg.VocabSize, 3)
	var prompts, conts [][]int32
	want := make([][]int32, len(params))
	for i, sp := range params {
		want[i] = sampled(t, ref, p, n, sp)
		// Each sequence's prompt differs in its first token, so the forced
		// drafter can tell them apart.
		q := slices.Clone(p)
		q[0] = int32(i)
		prompts, conts = append(prompts, q), append(conts, sampled(t, ref, q, n, sp))
	}
	opt := fastOpts(dir, 2)
	opt.Draft = pipeline.DraftConfig{Fixed: true, KMax: 3, Drafter: &forced{prompts: prompts, conts: conts, vocab: int32(ref.Cfg.VocabSize)}}
	g := startGroup(t, opt)
	ctx := testctx.Context(t)
	c := NewCollector()
	for i, sp := range params {
		if err := g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: prompts[i], MaxTokens: n, Sampling: sp, Sink: c}); err != nil {
			t.Fatal(err)
		}
	}
	for i, sp := range params {
		got, _, err := c.Wait(ctx, name("s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, conts[i]) {
			t.Fatalf("%+v: %v\nmonolithic: %v", sp, got, conts[i])
		}
	}
	if st := g.Head().Stats(); st.AcceptedTokens == 0 || st.AcceptedTokens == st.DraftedTokens {
		t.Fatalf("drafted %d, accepted %d: the check needs both", st.DraftedTokens, st.AcceptedTokens)
	}
	_ = want
	g.checkFreed(t)
}

// TestDraftsStopAndLimit: a stop token or max_tokens inside an accepted
// run of drafts ends the sequence exactly where plain decoding does; a
// request that turns drafting off drafts nothing.
func TestDraftsStopAndLimit(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(5, ref.Cfg.VocabSize, 9)
	want := ref.Greedy(t, p, 16)
	stop := want[6]
	cut := slices.Index(want, stop) + 1
	// A drafter that is always right: the stop token and the limit fall
	// inside accepted runs.
	right := &forced{prompts: [][]int32{p}, conts: [][]int32{want}, vocab: int32(ref.Cfg.VocabSize)}
	opt := fastOpts(dir, 3)
	opt.Draft = pipeline.DraftConfig{Fixed: true, KMax: 4, Drafter: exact{right}}
	g := startGroup(t, opt)
	ctx := testctx.Context(t)
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "stop", Tokens: p, MaxTokens: 16, Stop: []int32{stop}, Sink: c}); err != nil {
		t.Fatal(err)
	}
	got, res, err := c.Wait(ctx, "stop")
	if err != nil || res.Reason != pipeline.ReasonStop || !slices.Equal(got, want[:cut]) {
		t.Fatalf("stop token %d: %v %v %+v, want %v", stop, got, err, res, want[:cut])
	}
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "limit", Tokens: p, MaxTokens: 7, Sink: c}); err != nil {
		t.Fatal(err)
	}
	got, res, err = c.Wait(ctx, "limit")
	if err != nil || res.Reason != pipeline.ReasonLength || !slices.Equal(got, want[:7]) {
		t.Fatalf("max_tokens 7: %v %v %+v, want %v", got, err, res, want[:7])
	}
	if res.Accepted == 0 || res.Steps >= res.Tokens {
		t.Fatalf("max_tokens 7: %d tokens in %d steps, %d accepted: the drafts were not used", res.Tokens, res.Steps, res.Accepted)
	}
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "off", Tokens: p, MaxTokens: 7, NoDraft: true, Sink: c}); err != nil {
		t.Fatal(err)
	}
	got, res, err = c.Wait(ctx, "off")
	if err != nil || !slices.Equal(got, want[:7]) || res.Drafted != 0 || res.Steps != 7 {
		t.Fatalf("drafting off: %v %v %+v", got, err, res)
	}
	g.checkFreed(t)
}

// exact is a forced drafter without its planted errors.
type exact struct{ f *forced }

func (e exact) Draft(tokens []int32, k int) []int32 {
	for i, p := range e.f.prompts {
		if len(tokens) >= len(p) && slices.Equal(tokens[:len(p)], p) {
			g := len(tokens) - len(p)
			c := e.f.conts[i]
			if g >= len(c) {
				return nil
			}
			return slices.Clone(c[g:min(g+k, len(c))])
		}
	}
	return nil
}

// runGrammar submits the grammar-constrained chats of seeds to g and
// returns each one's tokens, checking that it ended with its reply.
func runGrammar(t *testing.T, g *Group, prompt []int32, spec *grammar.Spec, seeds int) [][]int32 {
	t.Helper()
	ctx := testctx.Context(t)
	c := NewCollector()
	for seed := range seeds {
		req := pipeline.Request{ID: name("g%d", seed), Tokens: prompt, MaxTokens: 600, Grammar: spec, Sink: c,
			Sampling: sampling.Params{Temperature: 1, Seed: uint64(seed)}}
		if err := g.Head().Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	out := make([][]int32, seeds)
	for seed := range seeds {
		toks, res, err := c.Wait(ctx, name("g%d", seed))
		if err != nil || res.Reason != pipeline.ReasonStop {
			t.Fatalf("g%d: %v, %+v", seed, err, res)
		}
		out[seed] = toks
	}
	g.checkFreed(t)
	return out
}

// TestDraftsWithinAGrammar: grammar-constrained sampled replies with
// drafts (forced, with planted errors, some of which the grammar's mask
// forbids) are the very replies drawn without drafts, each ending where
// its grammar's reply ends.
func TestDraftsWithinAGrammar(t *testing.T) {
	dir := testmodel.Dir(t, "demo", 1, 2)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	chat := grammarChat(false)
	spec, err := chat.Constraint(4)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.EncodeChat(chat)
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, len(ids))
	for i, id := range ids {
		prompt[i] = int32(id)
	}
	const seeds = 3
	off := Options{ModelDir: dir, Ranks: 2, Draft: pipeline.DraftConfig{Off: true}}
	want := runGrammar(t, startGroup(t, off), prompt, spec, seeds)

	// The forced drafter tells the sequences apart by their output so far.
	f := &byOutput{conts: want, prompt: len(prompt), vocab: int32(tok.VocabSize())}
	on := Options{ModelDir: dir, Ranks: 2, Draft: pipeline.DraftConfig{Fixed: true, KMax: 4, Drafter: f}}
	g := startGroup(t, on)
	got := runGrammar(t, g, prompt, spec, seeds)
	for seed := range seeds {
		if !slices.Equal(got[seed], want[seed]) {
			t.Fatalf("seed %d with drafts: %v\nwithout: %v", seed, got[seed], want[seed])
		}
	}
	st := g.Head().Stats()
	t.Logf("drafted %d, accepted %d in %d verifications; %d tokens in %d steps", st.DraftedTokens, st.AcceptedTokens, st.VerifiedSteps, st.Tokens, st.DecodeSteps)
	if st.AcceptedTokens == 0 || st.AcceptedTokens == st.DraftedTokens {
		t.Fatalf("drafted %d, accepted %d: the check needs both", st.DraftedTokens, st.AcceptedTokens)
	}
}

// byOutput drafts the continuation of whichever known output the
// sequence's output so far begins (the first, on a tie), with a planted
// error at a position that moves from draft to draft.
type byOutput struct {
	conts  [][]int32
	prompt int
	vocab  int32

	mu sync.Mutex
	n  int
}

func (b *byOutput) Draft(tokens []int32, k int) []int32 {
	out := tokens[b.prompt:]
	for _, c := range b.conts {
		if len(out) >= len(c) || !slices.Equal(c[:len(out)], out) {
			continue
		}
		d := slices.Clone(c[len(out):min(len(out)+k, len(c))])
		b.mu.Lock()
		e := b.n % (k + 1)
		b.n++
		b.mu.Unlock()
		if e < len(d) {
			d[e] = (d[e] + 1) % b.vocab
		}
		return d
	}
	return nil
}

// TestDraftsCancelMidVerify: a sequence cancelled while its verify step is
// in flight (the cancel comes as the head drafts it) ends as cancelled on
// every rank, with the tokens so far plain decoding's; the ranks free it,
// pending verify inputs and all, and the group goes on decoding exactly.
func TestDraftsCancelMidVerify(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(5, ref.Cfg.VocabSize, 9)
	want := ref.Greedy(t, p, 40)
	inner := &forced{prompts: [][]int32{p}, conts: [][]int32{want}, vocab: int32(ref.Cfg.VocabSize)}
	var g *Group
	ctx := testctx.Context(t)
	cancelled := make(chan error, 1)
	var once sync.Once
	d := draftFunc(func(tokens []int32, k int) []int32 {
		out := inner.Draft(tokens, k)
		if len(tokens) >= len(p)+6 && len(out) > 0 {
			once.Do(func() { go func() { cancelled <- g.Head().Cancel(ctx, "long") }() })
		}
		return out
	})
	opt := fastOpts(dir, 3)
	opt.Draft = pipeline.DraftConfig{Fixed: true, KMax: 4, Drafter: d}
	g = startGroup(t, opt)
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "long", Tokens: p, MaxTokens: 40, Sink: c}); err != nil {
		t.Fatal(err)
	}
	got, res, err := c.Wait(ctx, "long")
	if err != nil || res.Reason != pipeline.ReasonCancelled || len(got) < 6 || !slices.Equal(got, want[:len(got)]) {
		t.Fatalf("cancelled: %v, %v, %+v; want a cancelled prefix of %v", got, err, res, want)
	}
	if err := <-cancelled; err != nil {
		t.Fatal(err)
	}
	g.checkFreed(t)
	// The group is clean: the same prompt again decodes all of it.
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "again", Tokens: p, MaxTokens: 40, Sink: c}); err != nil {
		t.Fatal(err)
	}
	got, res, err = c.Wait(ctx, "again")
	if err != nil || !slices.Equal(got, want) || res.Accepted == 0 {
		t.Fatalf("after the cancel: %v, %v, %+v; want %v", got, err, res, want)
	}
	g.checkFreed(t)
}

// draftFunc adapts a function to draft.Drafter.
type draftFunc func(tokens []int32, k int) []int32

func (f draftFunc) Draft(tokens []int32, k int) []int32 { return f(tokens, k) }
