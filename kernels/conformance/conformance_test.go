package conformance

import (
	"context"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/mxfp"
)

// full reports whether the whole suite (more rows, heads, experts and
// prompts) runs instead of the CI subset: TANDEM_CONFORMANCE=full.
func full() bool { return os.Getenv("TANDEM_CONFORMANCE") == "full" }

func tinyModel(t *testing.T) string {
	t.Helper()
	preset := "tiny"
	if full() {
		preset = "small"
	}
	dir, err := synth.Ensure(context.Background(), synth.CacheDir(), preset, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func runSuite(t *testing.T, be kernels.Backend, opt Options) *Report {
	t.Helper()
	opt.Short = !full()
	opt.Log = func(s string) { t.Log(s) }
	rep, err := Run(context.Background(), be, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// The CPU backend against itself: every op, layer and the model, and the
// results must be bit-identical (the reference is deterministic), not
// merely within tolerance.
func TestCPUBackend(t *testing.T) {
	rep := runSuite(t, cpu.New(0), Options{ModelDir: tinyModel(t)})
	for _, r := range rep.Failed() {
		t.Errorf("%s failed: rel %.3g max %.3g (tol %.0e) %s", r.Name, r.Rel, r.Max, r.Tol, r.Note)
	}
	for _, r := range rep.Results {
		if r.Rel != 0 || r.Max != 0 {
			t.Errorf("%s: the CPU backend differs from itself: rel %.3g", r.Name, r.Rel)
		}
	}
	if rep.Agreement != 1 {
		t.Errorf("greedy agreement %.3f, want 1", rep.Agreement)
	}
	want := []string{"matmul/BF16", "matmul/MXFP4", "matmul/MXFP8(E4M3)", "matmul/F32", "embed/BF16", "rmsnorm/row", "rmsnorm/group128",
		"l2norm/group128", "sigmoid", "addbias", "kda_gate", "add+mul_sigmoid", "copy_block", "attnres_mix", "short_conv_silu",
		"kda/chunked64", "kda/recurrent", "write_latent/BF16", "mla_attention/expanded", "router_topk", "routed_experts/MXFP4",
		"situ_mlp/BF16", "model/logits", "model/verify_rows", "model/disaggregated"}
	var names []string
	for _, r := range rep.Results {
		names = append(names, r.Name)
	}
	for _, w := range want {
		if !slices.Contains(names, w) {
			t.Errorf("case %s did not run (ran %v)", w, names)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "layer/kda") }) ||
		!slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "layer/mla") }) {
		t.Errorf("layer checks missing a kind: %v", names)
	}
	t.Logf("report:\n%s", rep.Markdown())
}

// bf16Inputs is the CPU backend with a device's numerics where a device
// backend is allowed them: the activations feeding every product are
// rounded to BF16 first. The suite must pass it, or the tolerances are
// tighter than the contract they state.
type bf16Inputs struct{ *cpu.Backend }

func roundBF16(t *kernels.Tensor) *kernels.Tensor {
	o := &kernels.Tensor{Rows: t.Rows, Cols: t.Cols, Data: make([]float32, len(t.Data))}
	for i, v := range t.Data {
		o.Data[i] = mxfp.BF16ToF32(mxfp.F32ToBF16(v))
	}
	return o
}

func (b bf16Inputs) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	b.Backend.MatMul(dst, roundBF16(x), w)
}
func (b bf16Inputs) SiTUMLP(dst, x *kernels.Tensor, g, u, d *kernels.Matrix, b1, b2 float32) {
	b.Backend.SiTUMLP(dst, roundBF16(x), g, u, d, b1, b2)
}
func (b bf16Inputs) RoutedExperts(u, z *kernels.Tensor, ids []int32, w []float32, k int, ex []kernels.Expert, b1, b2 float32) {
	b.Backend.RoutedExperts(u, roundBF16(z), ids, w, k, ex, b1, b2)
}
func (b bf16Inputs) MLAAttention(o, q *kernels.Tensor, span kernels.Span, c *kernels.LatentCache, kvb *kernels.Matrix, h, n, r, v int, sc float32, ab bool) {
	b.Backend.MLAAttention(o, roundBF16(q), span, c, kvb, h, n, r, v, sc, ab)
}
func (b bf16Inputs) Name() string { return "cpu+bf16-inputs" }

func TestBF16InputsPass(t *testing.T) {
	if testing.Short() {
		t.Skip("short: the CPU run already covers every case")
	}
	// Only the cases whose inputs the wrapper rounds, and the model.
	rep := runSuite(t, bf16Inputs{cpu.New(0)}, Options{ModelDir: tinyModel(t), Only: []string{"matmul", "mla", "routed", "situ"}})
	for _, r := range rep.Failed() {
		t.Errorf("%s failed with BF16 inputs: rel %.3g max %.3g (tol %.0e) %s", r.Name, r.Rel, r.Max, r.Tol, r.Note)
	}
	rounded := 0
	for _, r := range rep.Results {
		if strings.HasPrefix(r.Name, "matmul/BF16") && r.Rel > 0 {
			rounded++
		}
	}
	if rounded == 0 {
		t.Error("rounding the inputs to BF16 changed no matmul: the check is not exercising the tolerance")
	}
	t.Logf("greedy agreement with BF16 inputs: %.3f", rep.Agreement)
}

// Planted bugs: each must fail its case, or the suite cannot catch it.
type (
	bugMatMul    struct{ *cpu.Backend } // drops the last output column
	bugKDA       struct{ *cpu.Backend } // skips the span's last token
	bugLatent    struct{ *cpu.Backend } // truncates instead of rounding to nearest even
	bugMLA       struct{ *cpu.Backend } // attends one row less (off-by-one causal mask)
	bugLostState struct{ *cpu.Backend } // never writes the state back
	bugRouter    struct{ *cpu.Backend } // returns the experts unsorted by score
	bugRowMix    struct{ *cpu.Backend } // a product of several rows rounds its inputs to BF16 (depends on the batch)
)

func (b bugRowMix) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	if x.Rows > 1 {
		x = roundBF16(x)
	}
	b.Backend.MatMul(dst, x, w)
}

func (b bugMatMul) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	b.Backend.MatMul(dst, x, w)
	for r := 0; r < dst.Rows; r++ {
		dst.Data[r*dst.Cols+dst.Cols-1] = 0
	}
}
func (b bugKDA) KDA(o, q, k, v, g, beta *kernels.Tensor, span kernels.Span, S *kernels.Tensor, h, dk, dv, c int) {
	if span.Len() > 1 {
		span.Hi--
	}
	b.Backend.KDA(o, q, k, v, g, beta, span, S, h, dk, dv, c)
}
func (b bugLatent) WriteLatent(c *kernels.LatentCache, row int, src *kernels.Tensor, sr, n int) {
	b.Backend.WriteLatent(c, row, src, sr, n)
	for i := row * c.Cols; i < (row+n)*c.Cols; i++ {
		if c.BF16 != nil {
			c.BF16[i] = uint16(math.Float32bits(src.Data[(sr*c.Cols)+(i-row*c.Cols)]) >> 16)
		}
	}
}
func (b bugMLA) MLAAttention(o, q *kernels.Tensor, span kernels.Span, c *kernels.LatentCache, kvb *kernels.Matrix, h, n, r, v int, sc float32, ab bool) {
	cc := *c
	cc.Rows--
	if cc.BF16 != nil {
		cc.BF16 = cc.BF16[:cc.Rows*cc.Cols]
	}
	if cc.F32 != nil {
		cc.F32 = cc.F32[:cc.Rows*cc.Cols]
	}
	if span.Len() > 1 {
		span.Hi--
	}
	b.Backend.MLAAttention(o, q, span, &cc, kvb, h, n, r, v, sc, ab)
}
func (b bugLostState) AttachState(host []float32, rows, cols int) *kernels.Tensor {
	return &kernels.Tensor{Rows: rows, Cols: cols, Data: slices.Clone(host)}
}
func (b bugLostState) DetachState(*kernels.Tensor, []float32) {}
func (b bugRouter) RouterTopK(l *kernels.Tensor, bias []float32, k int, renorm bool, sc float32, ids []int32, w []float32) {
	b.Backend.RouterTopK(l, bias, k, renorm, sc, ids, w)
	for r := 0; r < len(ids)/k; r++ {
		ids[r*k], ids[r*k+1] = ids[r*k+1], ids[r*k]
	}
}

func TestPlantedBugsFail(t *testing.T) {
	dir := tinyModel(t)
	for _, c := range []struct {
		be    kernels.Backend
		only  []string
		fails []string
		model bool
	}{
		{bugMatMul{cpu.New(0)}, []string{"matmul/BF16"}, []string{"matmul/BF16"}, false},
		{bugKDA{cpu.New(0)}, []string{"kda/"}, []string{"kda/chunked64", "kda/recurrent"}, false},
		{bugLatent{cpu.New(0)}, []string{"write_latent"}, []string{"write_latent/BF16"}, false},
		{bugMLA{cpu.New(0)}, []string{"mla_attention"}, []string{"mla_attention/expanded"}, false},
		{bugRouter{cpu.New(0)}, []string{"router_topk"}, []string{"router_topk"}, false},
		{bugLostState{cpu.New(0)}, []string{"short_conv", "kda/chunked"}, []string{"short_conv_silu", "kda/chunked64", "layer/kda+LatentMoE", "model/disaggregated"}, true},
		{bugRowMix{cpu.New(0)}, []string{"no op case"}, []string{"model/verify_rows"}, true},
	} {
		opt := Options{Only: c.only}
		if c.model {
			opt.ModelDir = dir
		}
		rep := runSuite(t, c.be, opt)
		failed := map[string]bool{}
		for _, r := range rep.Failed() {
			failed[r.Name] = true
		}
		for _, f := range c.fails {
			if !failed[f] {
				t.Errorf("%T: case %s passed; the planted bug must fail it (failed: %v)", c.be, f, failed)
			}
		}
	}
}

// The model on a backend whose tensors hide their values (Data nil) as a
// device's do: every layer and the model compute the CPU's bits, so model
// code moves values only through the backend.
func TestOpaqueBackend(t *testing.T) {
	rep := runSuite(t, Opaque{cpu.New(0)}, Options{ModelDir: tinyModel(t), Only: []string{"copy_block", "short_conv", "kda/chunked", "write_latent", "mla"}})
	for _, r := range rep.Results {
		if !r.Pass || r.Rel != 0 || r.Max != 0 {
			t.Errorf("%s on opaque tensors: rel %.3g max %.3g pass %v %s", r.Name, r.Rel, r.Max, r.Pass, r.Note)
		}
	}
	if rep.Agreement != 1 {
		t.Errorf("greedy agreement %.3f, want 1", rep.Agreement)
	}
}
