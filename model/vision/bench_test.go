package vision

import (
	"context"
	"testing"

	"github.com/tandem-inference/tandem/kernels/cpu"
)

// A 1024x768 image is 1036x784 after padding to multiples of 28 (the scale
// rule leaves it unscaled: 73x54 patches are far below 65,536): a grid of
// 74x56 = 4,144 patches and 1,036 feature rows.
const benchGridW, benchGridH = 74, 56

// BenchmarkTower times the tower and projector on one 1024x768 image on the
// CPU backend (all threads), BF16 weights from a checkpoint file:
//
//   - small: the tiny/small presets' tower (width 64, 2 blocks of 2 heads of
//     32, MLP 128, 8x8 table) projecting to the small preset's 768;
//   - k3/0-blocks and k3/1-block: K3's widths (1024, 12 heads of 128, MLP
//     4096, 64x64 table, projector 4096 -> 7168) with no block and with one;
//     the difference is one block's time, so K3's 27 blocks take about
//     t0 + 27 (t1 - t0). (The whole 27-block tower takes minutes per image on
//     a small machine, too long for a benchmark run.)
func BenchmarkTower(b *testing.B) {
	small := K3(768)
	small.Hidden, small.Intermediate, small.Layers, small.Heads, small.QKV = 64, 128, 2, 2, 64
	small.PosH, small.PosW = 8, 8
	b.Run("small", func(b *testing.B) { benchTower(b, &small, -1) })
	k3 := K3(7168)
	k3.Layers = 1
	b.Run("k3/0-blocks", func(b *testing.B) { benchTower(b, &k3, 0) })
	b.Run("k3/1-block", func(b *testing.B) { benchTower(b, &k3, 1) })
}

// benchTower loads c's random tower and times Features on one image,
// keeping only the first blocks blocks (-1: all).
func benchTower(b *testing.B, c *Config, blocks int) {
	ts := randomTensors(c, 1)
	dir := b.TempDir()
	writeCheckpoint(b, dir, visionJSON(c), ts)
	tw, err := Load(context.Background(), cpu.New(0), dir)
	if err != nil {
		b.Fatal(err)
	}
	defer tw.Close()
	if blocks >= 0 {
		tw.w.Blocks = tw.w.Blocks[:blocks]
	}
	img := []Patches{randomPatches(c, benchGridH, benchGridW, 1)}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tw.Features(context.Background(), img); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(c.Rows(img[0])), "rows")
}
