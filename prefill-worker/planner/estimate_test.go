package planner_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
)

// maxRatio bounds how conservative the estimate may be. It counts every
// GEMM and routed-expert scratch buffer as allocated per call (exact, within
// 1.4x, for the CPU backend that allocates them per call); a backend that
// pools them per worker allocates less, and the estimate then over-counts
// those buffers (up to ~3.6x on the small preset's MLA layers). Tile
// temporaries are a small share of a pass's memory next to activations and
// states, so the simpler, always-safe bound is kept.
const maxRatio = 4.0

// TestLayerTempsCalibrated runs real layers on the CPU backend and checks
// the planner's temporaries estimate against what the allocator reports for
// each layer call: never below it (the budget must hold), and not so far
// above it that passes are needlessly split.
func TestLayerTempsCalibrated(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are not the backend's")
	}
	type tc struct {
		preset string
		shards int
		layers int // run layers [0, layers)
		lens   []int
	}
	cases := []tc{
		{"tiny", 2, 9, []int{64}},
		{"tiny", 2, 9, []int{150, 40, 7}},
		{"tiny", 2, 9, []int{300}},
	}
	if !testing.Short() {
		cases = append(cases, tc{"small", 0, 4, []int{100, 28}})
	}
	for _, c := range cases {
		dir := testmodel.Dir(t, c.preset, 1, c.shards)
		threads := 2
		m, err := model.Load(dir, cpu.New(threads), model.LoadOptions{Embed: true})
		if err != nil {
			t.Fatal(err)
		}
		seqs := make([]*model.SeqState, len(c.lens))
		toks := make([][]int32, len(c.lens))
		rows := 0
		for i, n := range c.lens {
			seqs[i] = m.Cfg.NewSeqState(0, m.Cfg.NumLayers, model.StateOptions{LatentDType: model.BF16, LatentCapacity: n})
			toks[i] = make([]int32, n)
			for j := range toks[i] {
				toks[i][j] = int32((j*7919 + 13*i + 5) % m.Cfg.VocabSize)
			}
			rows += n
		}
		b, err := m.NewBatch(seqs, toks)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for L := 0; L < c.layers; L++ {
			var before, after runtime.MemStats
			// Two collections empty the backend's scratch pools, so the call
			// allocates (and the allocator counts) its scratch afresh.
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&before)
			if err := m.RunLayer(context.Background(), m.Layers[L], b, model.PhasePrefill); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			got := int64(after.TotalAlloc - before.TotalAlloc)
			est := planner.LayerTemps(m.Cfg, L, threads).Bytes(rows, len(c.lens))
			ratio := float64(est) / float64(got)
			worst = max(worst, ratio)
			t.Logf("%s layer %d (%s, dense %v) rows %d seqs %d: allocated %d, estimate %d (x%.2f)",
				c.preset, L, m.Cfg.LayerKind(L), m.Cfg.IsDense(L), rows, len(c.lens), got, est, ratio)
			if est < got {
				t.Errorf("%s layer %d, %d rows: estimate %d is below the %d bytes the layer allocated", c.preset, L, rows, est, got)
			}
			if ratio > maxRatio {
				t.Errorf("%s layer %d, %d rows: estimate %d is %.2fx the %d bytes allocated (want <= %.1fx)", c.preset, L, rows, est, ratio, got, maxRatio)
			}
		}
		m.Close()
	}
}
