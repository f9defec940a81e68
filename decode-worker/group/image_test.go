package group

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/internal/testimage"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/vision"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

// images are a prompt's images for a request: runs and hashes from media
// (hash: the features' seed), with no rows (Encode computes them).
func images(media []model.Media, d int, seeds []uint64) []pipeline.Image {
	out := make([]pipeline.Image, len(media))
	for i, md := range media {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], seeds[i])
		out[i] = pipeline.Image{At: md.At, Len: md.Len(d), Hash: sha256.Sum256(b[:])}
	}
	return out
}

// encoder stands for the vision tower: it returns media's rows and counts
// its calls.
func encoder(media []model.Media, calls *atomic.Int32) func(context.Context) ([][]float32, error) {
	return func(ctx context.Context) ([][]float32, error) {
		calls.Add(1)
		out := make([][]float32, len(media))
		for i, md := range media {
			out[i] = md.Rows
		}
		return out, ctx.Err()
	}
}

// prefillRemote is the prefill worker's side of a remote job: a streaming
// executor with no weights resident prefills toks, with media's rows in
// place of the images' pad runs, and sends each layer's state to its rank
// of g under session.
func prefillRemote(t *testing.T, ctx context.Context, dir string, g *Group, session string, toks []int32, media []model.Media) {
	t.Helper()
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
	ex := &executor.Executor{Model: model.New(cfg, be), Stream: st, Embed: emb}
	place := kvtransfer.LayerMap{}
	for _, s := range g.Layout.Ranks {
		for L := s.Lo; L < s.Hi; L++ {
			place[L] = s.Endpoint
		}
	}
	snd, err := kvtransfer.NewSender(kvtransfer.SenderConfig{Session: session, Secret: testSecret, Placement: place,
		Deadline: time.Now().Add(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	out := sink.NewQueue(snd, 4)
	// Two super-chunks, the first ending inside the first image's run.
	state := cfg.NewSeqState(0, cfg.NumLayers, model.StateOptions{LatentDType: model.BF16, LatentCapacity: len(toks)})
	for lo := 0; lo < len(toks); lo += 64 {
		hi := min(lo+64, len(toks))
		seq := &executor.Seq{ID: session, Ctx: ctx, Tokens: toks[lo:hi], Media: model.MediaWindow(media, lo, hi, cfg.HiddenSize),
			State: state, Final: hi == len(toks), Out: out}
		if _, err := ex.Run(ctx, []*executor.Seq{seq}, executor.Options{Depth: 2}); err != nil || seq.Err != nil {
			out.Abort(err)
			t.Fatal(err, seq.Err)
		}
	}
	if err := out.Close(ctx, len(toks)); err != nil {
		t.Fatal(err)
	}
}

// TestImagePromptBothPaths: a prompt with two images, prefilled by the
// group itself (the tower's rows from Encode, called once; the group's
// chunks cut an image's run) and by a streaming prefill worker (its
// super-chunks cut a run), gives the monolithic model's greedy ids with
// the features in place on both paths. A group that cannot compute rows
// ends the sequence saying so.
func TestImagePromptBothPaths(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	seeds := []uint64{1, 2}
	p, media := testmodel.ImagePrompt(ref.Cfg, []int{30, 20, 5}, []int{40, 24}, seeds)
	const n = 12
	want, err := ref.GenerateMedia(context.Background(), p, media, n)
	if err != nil {
		t.Fatal(err)
	}
	if text := ref.Greedy(t, p, n); slices.Equal(text, want) {
		t.Fatal("the features do not change the greedy ids: the test proves nothing")
	}
	imgs := images(media, ref.Cfg.HiddenSize, seeds)

	opt := fastOpts(dir, 3)
	opt.PrefillChunk = 64
	g := startGroup(t, opt)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var calls atomic.Int32
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "local", Tokens: p, MaxTokens: n, Sink: c,
		Images: imgs, Encode: encoder(media, &calls)}); err != nil {
		t.Fatal(err)
	}
	got, res, err := c.Wait(ctx, "local")
	if err != nil || res.Reason != pipeline.ReasonLength {
		t.Fatalf("%v %+v", err, res)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("local prefill with images: %v\nmonolithic: %v", got, want)
	}
	if calls.Load() != 1 {
		t.Fatalf("the tower ran %d times for one job", calls.Load())
	}

	if err := g.Head().Submit(ctx, pipeline.Request{ID: "remote", Tokens: p[len(p)-1:], MaxTokens: n, Sink: c,
		Remote: g.remote("xfer-img", len(p)-1), Images: imgs}); err != nil {
		t.Fatal(err)
	}
	prefillRemote(t, ctx, dir, g, "xfer-img", p[:len(p)-1], media)
	got, res, err = c.Wait(ctx, "remote")
	if err != nil || res.Reason != pipeline.ReasonLength {
		t.Fatalf("%v %+v", err, res)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("remote prefill with images: %v\nmonolithic: %v", got, want)
	}

	if err := g.Head().Submit(ctx, pipeline.Request{ID: "blind", Tokens: p, MaxTokens: n, Sink: c, Images: imgs}); err != nil {
		t.Fatal(err)
	}
	_, res, err = c.Wait(ctx, "blind")
	if err != nil || res.Reason != pipeline.ReasonError || !strings.Contains(res.Err.Error(), "no vision tower") {
		t.Fatalf("a group without rows or a tower: %v %+v", err, res)
	}
	g.checkFreed(t)
}

// TestImagePrefixCache: the next turn of a conversation about an image
// resumes from the cached state past the image and needs no tower; the
// same turn about another image of the same size resumes from nothing.
// Both give the monolithic model's greedy ids.
func TestImagePrefixCache(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	d := ref.Cfg.HiddenSize
	const n = 8
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p1, mediaA := testmodel.ImagePrompt(ref.Cfg, []int{30, 50}, []int{70}, []uint64{1})
	out1, err := ref.GenerateMedia(ctx, p1, mediaA, n)
	if err != nil {
		t.Fatal(err)
	}
	p2 := concat(p1, out1, p1[110:140])
	out2, err := ref.GenerateMedia(ctx, p2, mediaA, n)
	if err != nil {
		t.Fatal(err)
	}
	mediaB := []model.Media{{At: mediaA[0].At, Rows: testmodel.Features(70, d, 9)}}
	outB, err := ref.GenerateMedia(ctx, p2, mediaB, n)
	if err != nil {
		t.Fatal(err)
	}

	opt := fastOpts(dir, 3)
	opt.PrefillChunk = 64
	g := startGroup(t, opt)
	c := NewCollector()
	for _, tc := range []struct {
		id     string
		p      []int32
		media  []model.Media
		seed   uint64
		want   []int32
		cached int
		tower  int32
	}{
		{"turn1", p1, mediaA, 1, out1, 0, 1},
		{"turn2", p2, mediaA, 1, out2, 128, 0}, // the image lies in the cached 128 tokens
		{"other", p2, mediaB, 9, outB, 0, 1},   // same pad ids, another image
		{"turn2again", p2, mediaA, 1, out2, 128, 0},
	} {
		var calls atomic.Int32
		if err := g.Head().Submit(ctx, pipeline.Request{ID: tc.id, Tokens: tc.p, MaxTokens: n, Sink: c,
			Images: images(tc.media, d, []uint64{tc.seed}), Encode: encoder(tc.media, &calls)}); err != nil {
			t.Fatal(err)
		}
		got, res, err := c.Wait(ctx, tc.id)
		if err != nil || res.Reason != pipeline.ReasonLength {
			t.Fatalf("%s: %v %+v", tc.id, err, res)
		}
		if !slices.Equal(got, tc.want) {
			t.Fatalf("%s: %v\nmonolithic: %v", tc.id, got, tc.want)
		}
		if res.Cached != tc.cached || calls.Load() != tc.tower {
			t.Fatalf("%s: %d tokens from the cache and %d tower runs, want %d and %d", tc.id, res.Cached, calls.Load(), tc.cached, tc.tower)
		}
		// Every rank keeps the turn's entry before the next turn comes.
		kept := g.Head().Stats().Cache.Inserts
		if kept == 0 {
			t.Fatalf("%s: no entry kept", tc.id)
		}
		for r := range g.Layout.Ranks {
			g.waitCache(t, r, "the head's entries", func(s prefixcache.Stats) bool { return s.Inserts == kept })
		}
	}
}

// TestImageTowerCancelAndFailure: a sequence cancelled while its tower
// runs ends cancelled and cancels the tower's context; a tower that fails
// ends its sequence with the tower's error; the group frees both.
func TestImageTowerCancelAndFailure(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	p, media := testmodel.ImagePrompt(cfg, []int{10, 5}, []int{12}, []uint64{1})
	imgs := images(media, cfg.HiddenSize, []uint64{1})
	g := startGroup(t, fastOpts(dir, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := NewCollector()

	started, stopped := make(chan struct{}), make(chan error, 1)
	block := func(ctx context.Context) ([][]float32, error) {
		close(started)
		<-ctx.Done()
		stopped <- ctx.Err()
		return nil, ctx.Err()
	}
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "cancelled", Tokens: p, MaxTokens: 4, Sink: c, Images: imgs, Encode: block}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := g.Head().Cancel(ctx, "cancelled"); err != nil {
		t.Fatal(err)
	}
	if _, res, err := c.Wait(ctx, "cancelled"); err != nil || res.Reason != pipeline.ReasonCancelled {
		t.Fatalf("%v %+v", err, res)
	}
	if err := <-stopped; err == nil {
		t.Fatal("the tower's context was not cancelled")
	}

	fail := func(context.Context) ([][]float32, error) { return nil, errors.New("tower broke") }
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "failed", Tokens: p, MaxTokens: 4, Sink: c, Images: imgs, Encode: fail}); err != nil {
		t.Fatal(err)
	}
	if _, res, err := c.Wait(ctx, "failed"); err != nil || res.Reason != pipeline.ReasonError || !strings.Contains(res.Err.Error(), "tower broke") {
		t.Fatalf("%v %+v", err, res)
	}
	short := func(context.Context) ([][]float32, error) { return [][]float32{media[0].Rows[:cfg.HiddenSize]}, nil }
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "short", Tokens: p, MaxTokens: 4, Sink: c, Images: imgs, Encode: short}); err != nil {
		t.Fatal(err)
	}
	if _, res, err := c.Wait(ctx, "short"); err != nil || res.Reason != pipeline.ReasonError || !strings.Contains(res.Err.Error(), "feature values") {
		t.Fatalf("%v %+v", err, res)
	}
	// A run that reaches the last token is refused at once.
	bad := []pipeline.Image{{At: len(p) - 3, Len: 3}}
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "bad", Tokens: p, MaxTokens: 4, Sink: c, Images: bad}); err == nil || !strings.Contains(err.Error(), "must end with text") {
		t.Fatalf("an image at the prompt's end: %v", err)
	}
	g.checkFreed(t)
}

// TestImageRealTowerBothPaths: two PNGs through the tiny checkpoint's own
// vision tower: rank 0's encoder (decode, check the runs, the tower once)
// on the local path and the tower's rows streamed by the prefill side on
// the remote path give the monolithic reference's greedy ids.
func TestImageRealTowerBothPaths(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	c := ref.Cfg
	imgs := [][]byte{testimage.PNG(t, 56, 84, 1), testimage.PNG(t, 112, 56, 2)} // 6 and 8 rows
	var p []int32
	text := func(n, seed int) {
		for _, id := range testkit.Prompt(n, c.VocabSize, seed) {
			if id == c.MediaPadID() {
				id = 1
			}
			p = append(p, id)
		}
	}
	pads := func(n int) {
		for range n {
			p = append(p, c.MediaPadID())
		}
	}
	text(20, 1)
	pads(6)
	text(50, 2)
	pads(8)
	text(10, 3)
	const n = 10
	want := testimage.Greedy(t, ref, dir, p, imgs, n)

	tw, err := vision.Load(context.Background(), cpu.New(2), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	enc := imagejob.NewEncoder(c, tw, "decode group local")
	j, err := enc.Prepare(p, imgs)
	if err != nil {
		t.Fatal(err)
	}
	var ri []pipeline.Image
	for _, k := range j.Keys(0) {
		ri = append(ri, pipeline.Image{At: k.At, Len: k.Len, Hash: k.Hash})
	}
	g := startGroup(t, fastOpts(dir, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	col := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "local", Tokens: p, MaxTokens: n, Sink: col, Images: ri,
		Encode: func(ctx context.Context) ([][]float32, error) { return enc.Features(ctx, j) }}); err != nil {
		t.Fatal(err)
	}
	got, res, err := col.Wait(ctx, "local")
	if err != nil || res.Reason != pipeline.ReasonLength || !slices.Equal(got, want) {
		t.Fatalf("local: %v %+v %v\nmonolithic: %v", err, res, got, want)
	}
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "remote", Tokens: p[len(p)-1:], MaxTokens: n, Sink: col,
		Remote: g.remote("xfer-real", len(p)-1), Images: ri}); err != nil {
		t.Fatal(err)
	}
	prefillRemote(t, ctx, dir, g, "xfer-real", p[:len(p)-1], testimage.Media(t, dir, c, p, imgs))
	got, res, err = col.Wait(ctx, "remote")
	if err != nil || res.Reason != pipeline.ReasonLength || !slices.Equal(got, want) {
		t.Fatalf("remote: %v %+v %v\nmonolithic: %v", err, res, got, want)
	}
	if text := ref.Greedy(t, p, n); slices.Equal(text, want) {
		t.Fatal("the tower's rows give the greedy ids of the pads' own embeddings: the test proves nothing")
	}
}
