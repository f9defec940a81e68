// Package testimage gives tests images and the monolithic reference of
// image prompts: the checkpoint's vision tower run over a prompt's images
// on the CPU, its rows in place of the pad runs, and greedy generation
// (model.GenerateMedia), which both disaggregated paths must reproduce.
// Only tests import it.
package testimage

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
)

// PNG is a w x h opaque PNG whose pattern depends on seed.
func PNG(tb testing.TB, w, h int, seed uint8) []byte {
	tb.Helper()
	im := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			im.Set(x, y, color.NRGBA{uint8(x*7) + seed, uint8(y*5) ^ seed, seed, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, im); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

// Media runs dir's vision tower on the CPU over images, placed on
// prompt's pad runs (as a worker does), and returns the rows at their
// positions.
func Media(tb testing.TB, dir string, c *model.Config, prompt []int32, images [][]byte) []model.Media {
	tb.Helper()
	tw, err := vision.Load(context.Background(), cpu.New(0), dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer tw.Close()
	e := imagejob.NewEncoder(c, tw, "the reference")
	j, err := e.Prepare(prompt, images)
	if err != nil {
		tb.Fatal(err)
	}
	feats, err := e.Features(context.Background(), j)
	if err != nil {
		tb.Fatal(err)
	}
	return j.Media(feats, 0)
}

// Greedy is the monolithic reference of an image prompt: n greedy tokens
// after prompt with images' rows in place (ref loaded from dir).
func Greedy(tb testing.TB, ref testmodel.Reference, dir string, prompt []int32, images [][]byte, n int) []int32 {
	tb.Helper()
	out, err := ref.GenerateMedia(context.Background(), prompt, Media(tb, dir, ref.Cfg, prompt, images), n)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
