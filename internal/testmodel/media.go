package testmodel

import (
	"math/rand/v2"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/model"
)

// Features are n feature rows of width d, deterministic in seed, of the
// size of a projected image's (values in [-1, 1]).
func Features(n, d int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]float32, n*d)
	for i := range out {
		out[i] = float32(2*r.Float64() - 1)
	}
	return out
}

// ImagePrompt is a prompt of text with images: text[0] tokens, a run of
// rows[0] pad ids, text[1] tokens, ... (len(text) == len(rows)+1), and the
// media that fill the runs with Features seeded by seeds[i].
func ImagePrompt(c *model.Config, text, rows []int, seeds []uint64) ([]int32, []model.Media) {
	pad := c.MediaPadID()
	var p []int32
	var media []model.Media
	for i, n := range text {
		for _, id := range testkit.Prompt(n, c.VocabSize, 7*i+1) {
			if id == pad {
				id = 1 // no stray pad in the text
			}
			p = append(p, id)
		}
		if i < len(rows) {
			media = append(media, model.Media{At: len(p), Rows: Features(rows[i], c.HiddenSize, seeds[i])})
			for range rows[i] {
				p = append(p, pad)
			}
		}
	}
	return p, media
}
