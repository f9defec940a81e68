package model_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/tokenizer"
)

// TestMediaReplaceEmbeddedRows: a batch with media holds the feature rows
// at the image's positions, bit for bit, and the token embeddings elsewhere,
// in both sequences of a batch.
func TestMediaReplaceEmbeddedRows(t *testing.T) {
	m := loadModel(t, "tiny", 2, model.BF16)
	c := m.Cfg
	d := c.HiddenSize
	p, media := testmodel.ImagePrompt(c, []int{5, 3}, []int{6}, []uint64{1})
	q := slices.Clone(p[:4])
	seqs := []*model.SeqState{m.NewState(0, c.NumLayers), m.NewState(0, c.NumLayers)}
	b, err := m.NewBatchMedia(seqs, [][]int32{q, p}, [][]model.Media{nil, media})
	if err != nil {
		t.Fatal(err)
	}
	defer m.FreeBatch(b)
	got := make([]float32, b.Rows()*d)
	m.Backend.Download(got, b.Partial)
	plain, err := m.NewBatch(seqs, [][]int32{q, p})
	if err != nil {
		t.Fatal(err)
	}
	defer m.FreeBatch(plain)
	want := make([]float32, plain.Rows()*d)
	m.Backend.Download(want, plain.Partial)
	at := len(q) + media[0].At
	want0 := slices.Clone(want)
	copy(want[at*d:], media[0].Rows)
	if !slices.Equal(got, want) {
		t.Fatal("the batch's rows are not the features at the image and the embeddings elsewhere")
	}
	if slices.Equal(media[0].Rows[:d], want0[at*d:(at+1)*d]) {
		t.Fatal("the features equal the pad's embedding: the test proves nothing")
	}
}

// TestMediaChunkSplitIsExact: a prompt whose image run a chunk boundary
// cuts (at a multiple of the KDA chunk, as super-chunks and the decode
// group's chunks are cut) gives the state of the prompt in one piece, bit
// for bit, with each piece taking its window of the features.
func TestMediaChunkSplitIsExact(t *testing.T) {
	m := loadModel(t, "tiny", 2, model.BF16)
	c := m.Cfg
	ctx := context.Background()
	p, media := testmodel.ImagePrompt(c, []int{40, 30, 9}, []int{50, 20}, []uint64{1, 2})
	whole := m.NewState(0, c.NumLayers)
	if err := m.PrefillStateMedia(ctx, whole, p, media); err != nil {
		t.Fatal(err)
	}
	for _, cuts := range [][]int{{64}, {64, 128}} {
		split := m.NewState(0, c.NumLayers)
		lo := 0
		for _, hi := range append(cuts, len(p)) {
			w := model.MediaWindow(media, lo, hi, c.HiddenSize)
			if err := m.PrefillStateMedia(ctx, split, p[lo:hi], w); err != nil {
				t.Fatal(err)
			}
			lo = hi
		}
		a, _ := whole.MarshalBinary()
		b, _ := split.MarshalBinary()
		if string(a) != string(b) {
			t.Fatalf("cut at %v: the state differs from the prompt's in one piece", cuts)
		}
	}
	// The features matter: the pad ids' own embeddings give another state.
	text := m.NewState(0, c.NumLayers)
	if err := m.PrefillStateMedia(ctx, text, p, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := whole.MarshalBinary()
	b, _ := text.MarshalBinary()
	if string(a) == string(b) {
		t.Fatal("the state with features equals the state without")
	}
}

// TestGenerateMediaChecks: the reference refuses media that do not fit the
// prompt, with a message that says where, and one that covers the last
// token (which runs as a decode step).
func TestGenerateMediaChecks(t *testing.T) {
	m := loadModel(t, "tiny", 2, model.BF16)
	c := m.Cfg
	ctx := context.Background()
	p, media := testmodel.ImagePrompt(c, []int{4, 3}, []int{5}, []uint64{1})
	if _, err := m.GenerateMedia(ctx, p[:9], media, 2); err == nil || !strings.Contains(err.Error(), "decode step") {
		t.Fatalf("media covering the last token: %v", err)
	}
	bad := []model.Media{{At: 1, Rows: media[0].Rows[:c.HiddenSize+1]}}
	if _, err := m.GenerateMedia(ctx, p, bad, 2); err == nil || !strings.Contains(err.Error(), "multiple of the hidden size") {
		t.Fatalf("media of partial rows: %v", err)
	}
	over := []model.Media{media[0], {At: 6, Rows: media[0].Rows}}
	if _, err := m.GenerateMedia(ctx, p, over, 2); err == nil || !strings.Contains(err.Error(), "inside or before") {
		t.Fatalf("overlapping media: %v", err)
	}
	got, err := m.GenerateMedia(ctx, p, media, 6)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tiny greedy with an image: %v", got)
}

// TestMediaPadIDIsTheTokenizers: the id the workers find image runs by is
// the one the tokenizer expands an image's marker into, for the released
// vocabulary's size and a synthetic one.
func TestMediaPadIDIsTheTokenizers(t *testing.T) {
	for _, vocab := range []int{1024, 163840} {
		if vocab == 163840 && testing.Short() {
			continue
		}
		dir := t.TempDir()
		if err := tokenizer.WriteSynthetic(dir, vocab, nil); err != nil {
			t.Fatal(err)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		id, ok := tok.SpecialID(tokenizer.MediaPad)
		c := model.Config{}
		c.VocabSize = vocab
		if !ok || int32(id) != c.MediaPadID() {
			t.Fatalf("vocabulary %d: the tokenizer's <|media_pad|> is %d (%v), the model's %d", vocab, id, ok, c.MediaPadID())
		}
	}
}
