package worker_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// K3's layer sizes from the released shapes and dtypes (K3-SPEC §5.2).
const (
	k3Layer0Bytes  = 2_341_213_184     // KDA attention, dense FFN
	k3KDAMoEBytes  = 16_990_092_800    // KDA attention, 896 MXFP4 experts: the largest
	k3MLAMoEBytes  = 16_566_684_160    // MLA attention, 896 experts
	k3LayersBytes  = 1_555_267_943_424 // all 93 layers (the embedding and head are not streamed)
	k3KDAState     = 96*128*128*4 + 3*12288*3*4
	k3LatentPerTok = 576 * 2 // BF16 c_kv and k_pe of one MLA layer
)

// TestK3AtRealSize: the worker's view of the sparse, full-size K3 release
// (every header real, every weight a hole). The streamer's layout puts each
// layer in one extent of its own shard, reaching past 2^32 bytes, and sizes
// the ring slot to the largest layer; the memory model has the state sizes
// of K3-SPEC §4; the planner fits one 17 GB slot and a short prompt in a
// 20 GiB budget (depth 0: a second slot does not fit), deepens the ring as
// budgets allow, refuses a budget that cannot hold the largest layer beside
// the least work, cuts a long prompt into super-chunks, and rejects a prompt
// whose state alone cannot fit.
func TestK3AtRealSize(t *testing.T) {
	if testing.Short() {
		t.Skip("opens the 497,220-tensor checkpoint: about 10 s of CPU, far more under -race")
	}
	dir := testmodel.Sparse(t, "k3")
	info, err := worker.Inspect(worker.Config{Model: dir, Budget: 20 << 30, Depth: -1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	lay := info.Layout
	if len(lay.Layers) != 93 || lay.TensorBytes != k3LayersBytes {
		t.Fatalf("%d layers of %d bytes, want 93 of %d", len(lay.Layers), lay.TensorBytes, int64(k3LayersBytes))
	}
	var largest int64
	for L, ll := range lay.Layers {
		want := int64(k3MLAMoEBytes)
		switch {
		case L == 0:
			want = k3Layer0Bytes
		case L%4 != 3 && L != 92:
			want = k3KDAMoEBytes
		}
		if ll.TensorBytes != want || len(ll.Extents) != 1 {
			t.Fatalf("layer %d: %d bytes in %d extents, want %d in one", L, ll.TensorBytes, len(ll.Extents), want)
		}
		e := ll.Extents[0]
		if !strings.HasSuffix(lay.Files[e.File], fmt.Sprintf("model-%05d-of-000096.safetensors", L+1)) || e.Off%streamer.DefaultAlign != 0 ||
			e.Len%streamer.DefaultAlign != 0 || e.Need < want || e.Off+e.Len < e.Off+e.Need {
			t.Fatalf("layer %d extent %+v of %s", L, e, lay.Files[e.File])
		}
		if L > 0 && e.Off+e.Len <= 1<<32 {
			t.Fatalf("layer %d's extent ends at %d, before 2^32", L, e.Off+e.Len)
		}
		largest = max(largest, ll.ReadBytes)
	}
	if lay.SlotBytes != largest || largest < k3KDAMoEBytes || largest >= k3KDAMoEBytes+2*streamer.DefaultAlign {
		t.Fatalf("slot %d bytes, largest layer read %d, want the largest layer (%d) aligned", lay.SlotBytes, largest, int64(k3KDAMoEBytes))
	}

	c := info.Costs
	if c.SlotBytes != lay.SlotBytes || c.KDALayerState != k3KDAState || c.StateFixed != 69*k3KDAState ||
		c.LatentRowBytes != k3LatentPerTok || c.StatePerToken != 24*k3LatentPerTok {
		t.Fatalf("costs %+v: want slot %d, KDA state %d (x69), %d bytes per token per MLA layer (x24)", c, lay.SlotBytes, k3KDAState, k3LatentPerTok)
	}

	plan := func(budget int64, jobs ...planner.Job) (planner.Plan, error) {
		return planner.Make(planner.Input{Costs: c, Budget: budget, Depth: -1, Jobs: jobs})
	}
	short := planner.Job{ID: "short", Total: 7}
	p, err := plan(20<<30, short)
	if err != nil {
		t.Fatal(err)
	}
	if p.Depth != 0 || p.Mem.Ring != lay.SlotBytes || len(p.Pieces) != 1 || !p.Pieces[0].Final || p.Mem.Total > 20<<30 {
		t.Fatalf("20 GiB: %s", p)
	}
	t.Logf("20 GiB: %s", p)
	for budget, depth := range map[int64]int{40 << 30: 1, 80 << 30: 2} {
		if p, err := plan(budget, short); err != nil || p.Depth != depth {
			t.Fatalf("%d GiB: %s, %v; want depth %d", budget>>30, p, err, depth)
		}
	}
	if p, err := plan(16<<30, short); !errors.Is(err, planner.ErrBudget) {
		t.Fatalf("16 GiB, less than the largest layer and the least work: %s, %v", p, err)
	}
	// 100k tokens: 3.2 GB of state fits, their activations do not: the
	// first pass takes an aligned super-chunk.
	p, err = plan(20<<30, planner.Job{ID: "long", Total: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Pieces) != 1 || p.Pieces[0].Final || p.Pieces[0].Hi%planner.Align != 0 || p.Pieces[0].Hi < planner.Align || p.Mem.Total > 20<<30 {
		t.Fatalf("100k tokens under 20 GiB: %s", p)
	}
	// 1M tokens: 27.6 GB of MLA cache alone.
	p, err = plan(20<<30, planner.Job{ID: "huge", Total: 1_000_000})
	if err != nil || len(p.Rejected) != 1 || len(p.Pieces) != 0 {
		t.Fatalf("1M tokens under 20 GiB: %s, %v", p, err)
	}
}
