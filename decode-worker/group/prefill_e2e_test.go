package group

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

// TestPrefillWorkerEndToEnd: the prefill worker's executor streams the
// weights layer by layer, prefills prompt[:-1] and hands each layer's state
// to a kvtransfer sender as soon as it is done; a group of 3 ranks takes the
// sequence over and generates the monolithic model's greedy ids.
func TestPrefillWorkerEndToEnd(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(40, ref.Cfg.VocabSize, 11)
	want := ref.Greedy(t, p, 16)

	g := startGroup(t, fastOpts(dir, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "e2e", Tokens: p[len(p)-1:], MaxTokens: 16,
		Remote: g.remote("xfer-e2e", len(p)-1), Sink: c}); err != nil {
		t.Fatal(err)
	}

	// The prefill side: a streaming executor with no weights resident.
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	lay, err := streamer.NewLayout(ck, cfg.NumLayers, streamer.DefaultAlign)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(2)
	st, err := streamer.New(lay, be, streamer.Options{Slots: 3, ReadSize: 64 << 10, Readers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	emb, err := executor.NewEmbedder(ck, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pm := model.New(cfg, be)
	ex := &executor.Executor{Model: pm, Stream: st, Embed: emb}

	place := kvtransfer.LayerMap{}
	for _, s := range g.Layout.Ranks {
		for L := s.Lo; L < s.Hi; L++ {
			place[L] = s.Endpoint
		}
	}
	snd, err := kvtransfer.NewSender(kvtransfer.SenderConfig{Session: "xfer-e2e", Secret: testSecret, Placement: place,
		Deadline: time.Now().Add(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	out := sink.NewQueue(snd, 4)
	toks := p[:len(p)-1]
	seq := &executor.Seq{ID: "e2e", Ctx: ctx, Tokens: toks, Final: true, Out: out,
		State: cfg.NewSeqState(0, cfg.NumLayers, model.StateOptions{LatentDType: model.BF16, LatentCapacity: len(toks)})}
	if _, err := ex.Run(ctx, []*executor.Seq{seq}, executor.Options{Depth: 2}); err != nil {
		out.Abort(err)
		t.Fatal(err)
	}
	if seq.Err != nil {
		t.Fatal(seq.Err)
	}
	if err := out.Close(ctx, len(toks)); err != nil {
		t.Fatal(err)
	}

	got, res, err := c.Wait(ctx, "e2e")
	if err != nil || res.Reason != pipeline.ReasonLength {
		t.Fatalf("%v %+v", err, res)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("prefill worker + decode group: %v\nmonolithic: %v", got, want)
	}
	g.checkFreed(t)
}
