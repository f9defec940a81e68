package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// TestWorkersShowTheFittedTerms: `coordinator workers` shows what each
// worker advertises for the cost model: the pass floor with the read rate
// it comes from, and the compute terms fitted to finished prefills.
func TestWorkersShowTheFittedTerms(t *testing.T) {
	now := time.Now()
	ws := []cp.WorkerInfo{{ID: "prefill-0", Kind: cp.KindPrefill, Model: "m-0123456789ab-ba9876543210", Backend: "cpu", Time: now,
		Rates: cp.Rates{PassFloor: 950 * time.Millisecond, ReadBytesPerSec: 1.5e9,
			Compute: &cp.ComputeTerms{KDA: 11, MLA: 14, Attn: 2.5, MoE: 9, Dense: 16, Layer: 250 * time.Microsecond, Samples: 7, WorstError: 0.04}}},
		{ID: "rank-0", Kind: cp.KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 2, Time: now}}
	var b bytes.Buffer
	printWorkers(&b, ws, now)
	out := b.String()
	for _, want := range []string{"MODEL", "m-0123456789ab-ba9876543210", "pass floor 950ms (reads 1.50 GB/s)", "fitted kda 11 mla 14 attn 2.5 moe 9 dense 16 GFLOP/s, 0.25 ms/layer (7 samples, worst 4%)"} {
		if !strings.Contains(out, want) {
			t.Errorf("workers output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "fitted") != 1 {
		t.Errorf("a worker without terms shows some:\n%s", out)
	}
}
