package emu

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/mxfp"
)

// A check runs one kernel (or one composite op's chain of kernels) in the
// emulator on random inputs and compares it with the CPU backend; it
// returns nil when every value is within the check's tolerance. Tolerances
// are stated per check with their reason: the kernels compute in fp32
// (bf16 operands on the tensor cores) where the reference computes in fp64.
type check struct {
	name string
	run  func(e *env) error
}

var ref = cpu.New(2)

// bf16Gemm is the tolerance factor of a tensor-core product: x is rounded
// to bf16 (relative error ≤ 2⁻⁹) and the products are exact and summed in
// fp32, so |y − ref| ≤ (2⁻⁹ + I·2⁻²⁴)·Σ|x||w|; 2⁻⁸ leaves room for the
// device's own accumulation order. Weights that are not exact in bf16
// (F32, F16) are rounded too: twice that.
const bf16Gemm = 1.0 / 256

// composite is the tolerance of a chain of bf16 products with SiTU between
// them (dense SiTU MLP, routed experts), relative to the output's largest
// magnitude: each product rounds its input to bf16 (2⁻⁹), SiTU's slope is
// below 2 for the capped form, and errors of random sign add in the down
// projection's sum as they do in the output itself. 2% is ~10x the
// observed error and far below the planted bugs' O(1) errors.
const composite = 0.02

func checks() []check {
	cs := []check{
		{"add", checkAdd},
		{"add_bias", checkAddBias},
		{"sigmoid", checkSigmoid},
		{"mul_sigmoid", checkMulSigmoid},
		{"situ", checkSiTU},
		{"kda_gate", checkKDAGate},
		{"rmsnorm/weighted", func(e *env) error { return checkRMSNorm(e, 9, 96, 0, true) }},
		{"rmsnorm/unweighted", func(e *env) error { return checkRMSNorm(e, 5, 80, 0, false) }},
		{"rmsnorm/groups", func(e *env) error { return checkRMSNorm(e, 6, 64, 16, true) }},
		{"rmsnorm/k3-hidden", func(e *env) error { return checkRMSNorm(e, 3, 7168, 0, true) }},
		{"l2norm_groups", func(e *env) error { return checkL2Norm(e, 7, 3*32) }},
		{"l2norm_groups/k3-kda-heads", func(e *env) error { return checkL2Norm(e, 2, 4*128) }},
		{"attnres_mix", checkAttnRes},
		{"situ_mlp/bf16", func(e *env) error { return checkSiTUMLP(e, kernels.BF16) }},
		{"situ_mlp/mxfp4", func(e *env) error { return checkSiTUMLP(e, kernels.MXFP4) }},
		{"routed_experts/mxfp4", func(e *env) error { return checkRoutedExperts(e, kernels.MXFP4) }},
		{"routed_experts/bf16", func(e *env) error { return checkRoutedExperts(e, kernels.BF16) }},
	}
	for _, f := range []kernels.Format{kernels.F32, kernels.BF16, kernels.F16, kernels.MXFP4, kernels.MXFP8E4M3, kernels.MXFP8E5M2} {
		cs = append(cs, check{"embed/" + f.String(), func(e *env) error { return checkEmbed(e, f) }})
		cs = append(cs, check{"gemm_f32/" + f.String(), func(e *env) error { return checkGemm(e, f, true, 37, 40, 96) }})
	}
	for _, f := range []kernels.Format{kernels.BF16, kernels.MXFP4, kernels.MXFP8E4M3, kernels.MXFP8E5M2, kernels.F32} {
		// 70 x 72 output: partial tiles in both directions; I = 96 is three k steps.
		cs = append(cs, check{"gemm_bf16/" + f.String(), func(e *env) error { return checkGemm(e, f, false, 70, 72, 96) }})
	}
	cs = append(cs, checks2()...)
	cs = append(cs, checks3()...)
	cs = append(cs,
		check{"gemm_bf16/odd-k", func(e *env) error { return checkGemm(e, kernels.BF16, false, 9, 13, 50) }},
		check{"gemm_bf16/k3-hidden-mxfp4", func(e *env) error { return checkGemm(e, kernels.MXFP4, false, 5, 64, 7168) }},
	)
	return cs
}

// rngFor seeds each check from its name, so a failure reproduces alone.
func rngFor(name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(h.Sum64(), 1))
}

// parallelChecks is how many driver processes run at once: the emulator
// spends most of its time waking threads at barriers, not computing, so a
// few at a time use the cores that one leaves idle.
const parallelChecks = 3

// forEachCheck runs fn for every check as parallel subtests, at most
// parallelChecks at a time.
func forEachCheck(t *testing.T, bin string, fn func(t *testing.T, c check, e *env)) {
	sem := make(chan struct{}, parallelChecks)
	for _, c := range checks() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			fn(t, c, &env{bin: bin, rng: rngFor(c.name)})
		})
	}
}

// TestKernelsMatchCPU runs every check on the correct kernels.
func TestKernelsMatchCPU(t *testing.T) {
	bin, _ := drivers(t)
	forEachCheck(t, bin, func(t *testing.T, c check, e *env) {
		if err := c.run(e); err != nil {
			t.Error(err)
		}
		t.Logf("largest error: %.3g of the tolerance", e.worst)
	})
}

// TestPlantedBugsAreCaught runs every check on the kernels built with
// -DPLANTED_BUG: each must fail, or the check could not catch a real bug.
func TestPlantedBugsAreCaught(t *testing.T) {
	_, bin := drivers(t)
	forEachCheck(t, bin, func(t *testing.T, c check, e *env) {
		err := c.run(e)
		if err == nil {
			t.Errorf("the planted bug passed the %s check", c.name)
			return
		}
		t.Logf("caught: %v", err)
	})
}

func randF32(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

func tensor(rows, cols int, data []float32) *kernels.Tensor {
	return &kernels.Tensor{Rows: rows, Cols: cols, Data: append([]float32(nil), data...)}
}

// randMatrix makes a [rows, cols] weight in format f from normal values of
// the given scale (quantized by the mxfp codecs).
func randMatrix(rng *rand.Rand, f kernels.Format, rows, cols int, scale float64) *kernels.Matrix {
	v := randF32(rng, rows*cols, scale)
	m := &kernels.Matrix{Name: "w", Rows: rows, Cols: cols, Format: f, Data: make([]byte, rows*f.RowBytes(cols))}
	if f.Scaled() {
		m.Scales = make([]byte, rows*cols/kernels.MXBlock)
	}
	for r := 0; r < rows; r++ {
		src := v[r*cols : (r+1)*cols]
		row := m.Data[r*f.RowBytes(cols) : (r+1)*f.RowBytes(cols)]
		var sc []byte
		if f.Scaled() {
			sc = m.Scales[r*cols/kernels.MXBlock : (r+1)*cols/kernels.MXBlock]
		}
		switch f {
		case kernels.F32:
			copy(row, f32Bytes(src))
		case kernels.BF16, kernels.F16:
			for i, x := range src {
				h := mxfp.F32ToBF16(x)
				if f == kernels.F16 {
					h = mxfp.F32ToF16(x)
				}
				row[2*i], row[2*i+1] = byte(h), byte(h>>8)
			}
		case kernels.MXFP4:
			mxfp.QuantizeMXFP4(row, sc, src)
		case kernels.MXFP8E4M3, kernels.MXFP8E5M2:
			mxfp.QuantizeMXFP8(row, sc, src, f == kernels.MXFP8E5M2)
		}
	}
	if err := m.Check(); err != nil {
		panic(err)
	}
	return m
}

// decoded returns W as fp32 through the CPU backend's exact row decoder.
func decoded(w *kernels.Matrix) []float32 {
	ids := make([]int32, w.Rows)
	for i := range ids {
		ids[i] = int32(i)
	}
	d := ref.NewTensor(w.Rows, w.Cols)
	ref.Embed(d, w, ids)
	return d.Data
}

func p(kv ...any) map[string]float64 {
	m := make(map[string]float64)
	for i := 0; i < len(kv); i += 2 {
		switch v := kv[i+1].(type) {
		case int:
			m[kv[i].(string)] = float64(v)
		case float32:
			m[kv[i].(string)] = float64(v)
		case float64:
			m[kv[i].(string)] = v
		case bool:
			if v {
				m[kv[i].(string)] = 1
			} else {
				m[kv[i].(string)] = 0
			}
		default:
			panic(fmt.Sprintf("parameter %v of type %T", kv[i], v))
		}
	}
	return m
}

func checkAdd(e *env) error {
	bin, rng := e.bin, e.rng
	n := 1001
	a, b := randF32(rng, n, 3), randF32(rng, n, 3)
	out, err := run(bin, call{"add", p("n", n), map[string][]byte{"a": f32Bytes(a), "b": f32Bytes(b)}})
	if err != nil {
		return err
	}
	got, err := output(out, "dst", n)
	if err != nil {
		return err
	}
	want := ref.NewTensor(1, n)
	ref.Add(want, tensor(1, n, a), tensor(1, n, b))
	return e.within(got, want.Data, exact) // one fp32 addition: the same bits
}

func checkAddBias(e *env) error {
	bin, rng := e.bin, e.rng
	rows, cols := 7, 96
	x, bias := randF32(rng, rows*cols, 2), randF32(rng, cols, 1)
	out, err := run(bin, call{"add_bias", p("rows", rows, "cols", cols), map[string][]byte{"x": f32Bytes(x), "bias": f32Bytes(bias)}})
	if err != nil {
		return err
	}
	got, err := output(out, "x", rows*cols)
	if err != nil {
		return err
	}
	want := tensor(rows, cols, x)
	ref.AddBias(want, bias)
	return e.within(got, want.Data, exact)
}

// sigmoidTol bounds σ(x) = 1/(1+2^(−x·log2 e)) in fp32 against σ rounded
// once from fp64: the product x·log2 e is rounded (an absolute error of
// |x|·2⁻²³ in the exponent, which moves σ by that times 1−σ ≤ 1 relative),
// ex2.approx adds 2 ulps and the sum and division one each.
func sigmoidTol(sig, x float32) float64 {
	return math.Abs(float64(sig)) * (math.Abs(float64(x))*0x1p-23 + 5*0x1p-24)
}

func checkSigmoid(e *env) error {
	bin, rng := e.bin, e.rng
	n := 777
	x := randF32(rng, n, 6)
	out, err := run(bin, call{"sigmoid", p("n", n), map[string][]byte{"x": f32Bytes(x)}})
	if err != nil {
		return err
	}
	got, err := output(out, "x", n)
	if err != nil {
		return err
	}
	want := tensor(1, n, x)
	ref.Sigmoid(want)
	return e.within(got, want.Data, func(i int) float64 { return sigmoidTol(want.Data[i], x[i]) })
}

func checkMulSigmoid(e *env) error {
	bin, rng := e.bin, e.rng
	n := 640
	x, g := randF32(rng, n, 3), randF32(rng, n, 4)
	out, err := run(bin, call{"mul_sigmoid", p("n", n), map[string][]byte{"x": f32Bytes(x), "gate": f32Bytes(g)}})
	if err != nil {
		return err
	}
	got, err := output(out, "x", n)
	if err != nil {
		return err
	}
	want := tensor(1, n, x)
	ref.MulSigmoid(want, tensor(1, n, g))
	// σ's bound (relative) plus the product's rounding.
	return e.within(got, want.Data, func(i int) float64 {
		return sigmoidTol(want.Data[i], g[i]) + 0x1p-24*math.Abs(float64(want.Data[i]))
	})
}

// checkSiTU compares the activation alone with the spec's formula in fp64
// (kernels/cpu applies it only inside SiTUMLP, checked below as a whole):
// with β1 = 4, β2 = 25 (K3) the value is below 100 in magnitude and fp32
// evaluation of tanh, σ and four products stays within ~1e-6 relative.
func checkSiTU(e *env) error {
	bin, rng := e.bin, e.rng
	n := 999
	g, u := randF32(rng, n, 8), randF32(rng, n, 30)
	for i := 0; i < 40; i++ { // small arguments: tanh's polynomial branch
		g[i], u[i] = float32(rng.NormFloat64()*0.03), float32(rng.NormFloat64()*0.5)
	}
	b1, b2 := float32(4), float32(25)
	out, err := run(bin, call{"situ", p("n", n, "beta1", b1, "beta2", b2), map[string][]byte{"g": f32Bytes(g), "u": f32Bytes(u)}})
	if err != nil {
		return err
	}
	got, err := output(out, "h", n)
	if err != nil {
		return err
	}
	want := make([]float32, n)
	for i := range want {
		gv, uv := float64(g[i]), float64(u[i])
		want[i] = float32(4 * math.Tanh(gv/4) / (1 + math.Exp(-gv)) * 25 * math.Tanh(uv/25))
	}
	return e.within(got, want, func(i int) float64 { return 4e-6*math.Abs(float64(want[i])) + 1e-8 })
}

func checkKDAGate(e *env) error {
	bin, rng := e.bin, e.rng
	rows, heads, hd := 5, 3, 16
	cols := heads * hd
	z, aLog := randF32(rng, rows*cols, 2), randF32(rng, heads, 1)
	lower := float32(-5)
	out, err := run(bin, call{"kda_gate", p("rows", rows, "cols", cols, "head_dim", hd, "lower", lower),
		map[string][]byte{"z": f32Bytes(z), "a_log": f32Bytes(aLog)}})
	if err != nil {
		return err
	}
	got, err := output(out, "z", rows*cols)
	if err != nil {
		return err
	}
	want := tensor(rows, cols, z)
	ref.KDAGate(want, aLog, hd, lower)
	// exp and σ through ex2.approx, the argument exp(A)·z carrying exp's
	// error into σ: relative 1e-6 of |lower|·(1 + |A z|).
	return e.within(got, want.Data, func(i int) float64 {
		h := i % cols / hd
		return 1e-6 * 5 * (1 + math.Abs(math.Exp(float64(aLog[h]))*float64(z[i])))
	})
}

func checkEmbed(e *env, f kernels.Format) error {
	bin, rng := e.bin, e.rng
	vocab, cols, n := 50, 64, 23
	table := randMatrix(rng, f, vocab, cols, 0.5)
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
	}
	out, err := run(bin, call{"embed", p("fmt", int(f), "vocab", vocab, "cols", cols, "n", n),
		map[string][]byte{"table": table.Data, "scales": table.Scales, "ids": i32Bytes(ids)}})
	if err != nil {
		return err
	}
	got, err := output(out, "dst", n*cols)
	if err != nil {
		return err
	}
	want := ref.NewTensor(n, cols)
	ref.Embed(want, table, ids)
	return e.within(got, want.Data, exact) // every format decodes exactly to fp32
}

// checkGemm compares y = x·Wᵀ with the CPU's fp64-accumulated MatMul.
// Tensor cores: bf16Gemm·Σ|x||w| (see there). fp32 path: an fp32 FMA chain
// of I terms is within (I+1)·2⁻²⁴·Σ|x||w| of the exact sum.
func checkGemm(e *env, f kernels.Format, f32 bool, T, O, I int) error {
	bin, rng := e.bin, e.rng
	x := randF32(rng, T*I, 1)
	w := randMatrix(rng, f, O, I, 0.2)
	out, err := run(bin, call{"gemm", p("T", T, "O", O, "I", I, "fmt", int(f), "f32", f32),
		map[string][]byte{"x": f32Bytes(x), "w": w.Data, "ws": w.Scales}})
	if err != nil {
		return err
	}
	got, err := output(out, "y", T*O)
	if err != nil {
		return err
	}
	want := ref.NewTensor(T, O)
	ref.MatMul(want, tensor(T, I, x), w)
	wd := decoded(w)
	factor := bf16Gemm
	if f32 {
		factor = float64(I+1) / (1 << 24)
	} else if f == kernels.F32 || f == kernels.F16 {
		factor *= 2
	}
	return e.within(got, want.Data, func(i int) float64 {
		t, o := i/O, i%O
		var s float64
		for k := 0; k < I; k++ {
			s += math.Abs(float64(x[t*I+k]) * float64(wd[o*I+k]))
		}
		return factor*s + 1e-30
	})
}

func checkRMSNorm(e *env, rows, cols, group int, weighted bool) error {
	bin, rng := e.bin, e.rng
	x := randF32(rng, rows*cols, 1.5)
	g := group
	if g == 0 {
		g = cols
	}
	var w []float32
	arrays := map[string][]byte{"x": f32Bytes(x)}
	if weighted {
		w = randF32(rng, g, 1)
		arrays["w"] = f32Bytes(w)
	}
	eps := float32(1e-6)
	out, err := run(bin, call{"rmsnorm", p("ngroups", rows*cols/g, "group", g, "eps", eps, "has_w", weighted), arrays})
	if err != nil {
		return err
	}
	got, err := output(out, "dst", rows*cols)
	if err != nil {
		return err
	}
	want := ref.NewTensor(rows, cols)
	ref.RMSNorm(want, tensor(rows, cols, x), w, group, eps)
	// The fp32 sum of squares (per-thread strided partial sums, then a tree)
	// is within (group/128 + 12)·2⁻²⁴ relative; the root halves that, the
	// reciprocal and the scaling add 3 ulps: 1e-5 relative holds for groups
	// up to 7168 with a wide margin.
	return e.within(got, want.Data, func(i int) float64 { return 1e-5*math.Abs(float64(want.Data[i])) + 1e-9 })
}

func checkL2Norm(e *env, rows, cols int) error {
	bin, rng := e.bin, e.rng
	group := 32
	if cols%128 == 0 {
		group = 128
	}
	x := randF32(rng, rows*cols, 1)
	eps, scale := float32(1e-6), float32(0.0883883)
	out, err := run(bin, call{"l2norm_groups", p("ngroups", rows*cols/group, "group", group, "eps", eps, "scale", scale),
		map[string][]byte{"x": f32Bytes(x)}})
	if err != nil {
		return err
	}
	got, err := output(out, "x", rows*cols)
	if err != nil {
		return err
	}
	want := tensor(rows, cols, x)
	ref.L2NormGroups(want, group, eps, scale)
	return e.within(got, want.Data, func(i int) float64 { return 1e-5*math.Abs(float64(want.Data[i])) + 1e-9 })
}

func checkAttnRes(e *env) error {
	bin, rng := e.bin, e.rng
	nsrc, rows, cols := 5, 9, 96
	src := randF32(rng, nsrc*rows*cols, 1)
	for j := 0; j < nsrc; j++ { // sources of different scales, as the residual stack has
		for i := j * rows * cols; i < (j+1)*rows*cols; i++ {
			src[i] *= float32(j + 1)
		}
	}
	proj := randF32(rng, cols, 0.2)
	eps := float32(1e-6)
	out, err := run(bin, call{"attnres_mix", p("nsrc", nsrc, "rows", rows, "cols", cols, "eps", eps),
		map[string][]byte{"src": f32Bytes(src), "proj": f32Bytes(proj)}})
	if err != nil {
		return err
	}
	got, err := output(out, "dst", rows*cols)
	if err != nil {
		return err
	}
	sources := make([]*kernels.Tensor, nsrc)
	for j := range sources {
		sources[j] = tensor(rows, cols, src[j*rows*cols:(j+1)*rows*cols])
	}
	want := ref.NewTensor(rows, cols)
	ref.AttnResMix(want, sources, proj, eps)
	// Scores carry ~1e-6 relative error from fp32 sums; softmax weights
	// then err by ~|score|·1e-6; the mix by that times the sources'
	// magnitude: 1e-4 of the row's largest source value bounds it.
	return e.within(got, want.Data, func(i int) float64 {
		r := i / cols
		var m float64
		for j := 0; j < nsrc; j++ {
			for c := 0; c < cols; c++ {
				m = max(m, math.Abs(float64(src[(j*rows+r)*cols+c])))
			}
		}
		return 1e-4 * m
	})
}

func maxAbs(v []float32) float64 {
	var m float64
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}

func checkSiTUMLP(e *env, f kernels.Format) error {
	bin, rng := e.bin, e.rng
	T, d, inter := 33, 64, 96
	x := randF32(rng, T*d, 1)
	gate, up := randMatrix(rng, f, inter, d, 0.3), randMatrix(rng, f, inter, d, 0.3)
	down := randMatrix(rng, f, d, inter, 0.3)
	b1, b2 := float32(4), float32(25)
	out, err := run(bin, call{"situ_mlp", p("T", T, "d", d, "inter", inter, "fmt", int(f), "beta1", b1, "beta2", b2),
		map[string][]byte{"x": f32Bytes(x), "gate": gate.Data, "gate_s": gate.Scales, "up": up.Data, "up_s": up.Scales, "down": down.Data, "down_s": down.Scales}})
	if err != nil {
		return err
	}
	got, err := output(out, "y", T*d)
	if err != nil {
		return err
	}
	want := ref.NewTensor(T, d)
	ref.SiTUMLP(want, tensor(T, d, x), gate, up, down, b1, b2)
	tol := composite * maxAbs(want.Data)
	return e.within(got, want.Data, func(int) float64 { return tol })
}

// groupByExpert is the host side of the routed experts: the T·k (row, slot)
// pairs grouped by expert in slot order. order[i] is grouped row i's token
// row, offs the groups' bounds, pos each slot's grouped row, used the
// expert id of each group.
func groupByExpert(ids []int32, k, experts int) (order, offs, pos, used []int32, maxRows int) {
	count := make([]int32, experts)
	for _, e := range ids {
		count[e]++
	}
	start := make([]int32, experts)
	offs = []int32{0}
	for e, c := range count {
		if c == 0 {
			continue
		}
		start[e] = offs[len(offs)-1]
		offs = append(offs, start[e]+c)
		used = append(used, int32(e))
		maxRows = max(maxRows, int(c))
	}
	order, pos = make([]int32, len(ids)), make([]int32, len(ids))
	for slot, e := range ids {
		i := start[e]
		start[e]++
		order[i] = int32(slot / k)
		pos[slot] = i
	}
	return order, offs, pos, used, maxRows
}

func checkRoutedExperts(e *env, f kernels.Format) error {
	bin, rng := e.bin, e.rng
	T, k, E, lat, inter := 21, 3, 6, 64, 32
	z := randF32(rng, T*lat, 1)
	experts := make([]kernels.Expert, E)
	for e := range experts {
		experts[e] = kernels.Expert{W1: randMatrix(rng, f, inter, lat, 0.3), W3: randMatrix(rng, f, inter, lat, 0.3), W2: randMatrix(rng, f, lat, inter, 0.3)}
	}
	ids, weights := make([]int32, T*k), make([]float32, T*k)
	for r := 0; r < T; r++ {
		perm := rng.Perm(E - 1) // expert E-1 is never routed: a hole in the grouping
		for j := 0; j < k; j++ {
			ids[r*k+j] = int32(perm[j])
			weights[r*k+j] = float32(rng.Float64())
		}
	}
	order, offs, pos, used, maxRows := groupByExpert(ids, k, E)
	var w1, w3, w2, s1, s3, s2 []byte
	for _, e := range used {
		x := experts[e]
		w1, w3, w2 = append(w1, x.W1.Data...), append(w3, x.W3.Data...), append(w2, x.W2.Data...)
		s1, s3, s2 = append(s1, x.W1.Scales...), append(s3, x.W3.Scales...), append(s2, x.W2.Scales...)
	}
	b1, b2 := float32(4), float32(25)
	out, err := run(bin, call{"routed_experts",
		p("T", T, "k", k, "lat", lat, "inter", inter, "groups", len(used), "fmt", int(f), "maxrows", maxRows, "beta1", b1, "beta2", b2),
		map[string][]byte{"z": f32Bytes(z), "order": i32Bytes(order), "offs": i32Bytes(offs), "pos": i32Bytes(pos), "weights": f32Bytes(weights),
			"w1": w1, "w3": w3, "w2": w2, "s1": s1, "s3": s3, "s2": s2}})
	if err != nil {
		return err
	}
	got, err := output(out, "u", T*lat)
	if err != nil {
		return err
	}
	want := ref.NewTensor(T, lat)
	ref.RoutedExperts(want, tensor(T, lat, z), ids, weights, k, experts, b1, b2)
	tol := composite * maxAbs(want.Data)
	return e.within(got, want.Data, func(int) float64 { return tol })
}
