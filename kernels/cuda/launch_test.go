package cuda

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/conformance"
	"github.com/tandem-inference/tandem/kernels/cuda/ptx"
)

// fakeDriver answers every call with success and hands out distinct device
// addresses, so the backend's host side runs without a GPU: what it would
// launch can be checked against the PTX.
func fakeDriver() *driver {
	d := &driver{path: "fake"}
	next := devPtr(1 << 20)
	ok0 := func() cuResult { return 0 }
	d.cuCtxSetCurrent = func(cuContext) cuResult { return 0 }
	d.cuCtxSynchronize = ok0
	d.cuMemAlloc = func(p *devPtr, n uint64) cuResult { *p = next; next += devPtr((n + 255) &^ 255); return 0 }
	d.cuMemFree = func(devPtr) cuResult { return 0 }
	d.cuMemsetD8Async = func(devPtr, uint8, uint64, cuStream) cuResult { return 0 }
	d.cuMemcpyHtoDAsync = func(devPtr, unsafe.Pointer, uint64, cuStream) cuResult { return 0 }
	d.cuMemcpyDtoHAsync = func(unsafe.Pointer, devPtr, uint64, cuStream) cuResult { return 0 }
	d.cuMemcpyDtoDAsync = func(devPtr, devPtr, uint64, cuStream) cuResult { return 0 }
	d.cuMemcpy2DAsync = func(*memcpy2D, cuStream) cuResult { return 0 }
	d.cuStreamSynchronize = func(cuStream) cuResult { return 0 }
	d.cuStreamWaitEvent = func(cuStream, cuEvent, uint32) cuResult { return 0 }
	d.cuEventCreate = func(*cuEvent, uint32) cuResult { return 0 }
	d.cuEventRecord = func(cuEvent, cuStream) cuResult { return 0 }
	d.cuEventDestroy = func(cuEvent) cuResult { return 0 }
	d.cuModuleGetFunction = func(f *cuFunc, _ cuModule, _ *byte) cuResult { *f = 1; return 0 }
	d.cuLaunchKernel = func(cuFunc, uint32, uint32, uint32, uint32, uint32, uint32, uint32, cuStream, unsafe.Pointer, unsafe.Pointer) cuResult {
		return 0
	}
	return d
}

// entries parses every kernel's parameter types from the embedded PTX.
func entries(t *testing.T) map[string][]string {
	t.Helper()
	entry := regexp.MustCompile(`\.entry\s+(\w+)\(([^)]*)\)`)
	param := regexp.MustCompile(`\.param\s+\.(\w+)\s`)
	out := map[string][]string{}
	for mod, text := range ptx.Modules() {
		for _, m := range entry.FindAllStringSubmatch(text, -1) {
			var types []string
			for _, p := range param.FindAllStringSubmatch(m[2], -1) {
				types = append(types, p[1])
			}
			out[mod+"."+m[1]] = types
		}
	}
	if len(out) == 0 {
		t.Fatal("no kernel entries in the embedded PTX")
	}
	return out
}

// fakeBackend is a backend on the fake driver whose launches are checked
// against the PTX's parameters and counted.
func fakeBackend(t *testing.T) (*Backend, map[string]int) {
	sig := entries(t)
	b := &Backend{d: fakeDriver(), ctx: 1, mods: map[string]cuModule{}, funcs: map[string]cuFunc{}, pool: map[uint64][]devPtr{}, host: map[unsafe.Pointer]int{}}
	for mod := range ptx.Modules() {
		b.mods[mod] = 1
	}
	launched := map[string]int{}
	b.onLaunch = func(mod, name string, args []any) {
		key := mod + "." + name
		launched[key]++
		want, ok := sig[key]
		if !ok {
			t.Errorf("launch of %s: no such entry in the PTX", key)
			return
		}
		if len(want) != len(args) {
			t.Errorf("launch of %s with %d arguments; the PTX takes %d (%v)", key, len(args), len(want), want)
			return
		}
		for i, a := range args {
			if !fits(a, want[i]) {
				t.Errorf("launch of %s: argument %d is %T, the PTX parameter is .%s", key, i, a, want[i])
			}
		}
	}
	return b, launched
}

// TestCuBLASLtCall: with cuBLASLt enabled, a BF16 or MX MatMul decodes the
// weight (MX only) and the activations to BF16 with tandem_dequant_bf16 and
// calls cublasLtMatmul as D[O, T] = Aᵀ·B with A = W as [I, O] and B = X as
// [I, T], column-major, BF16 in, fp32 out; F32 weights keep the exact
// kernel.
func TestCuBLASLtCall(t *testing.T) {
	b, launched := fakeBackend(t)
	type layout struct {
		ty         int32
		rows, cols uint64
		ld         int64
	}
	var layouts []layout
	var trans []int32
	matmuls := 0
	next := uintptr(1)
	b.lt = &lt{
		descCreate: func(d *uintptr, compute, scale int32) int32 {
			if compute != cublasCompute32F || scale != cudaR32F {
				t.Errorf("desc: compute %d scale %d", compute, scale)
			}
			*d = next
			next++
			return 0
		},
		descDestroy: func(uintptr) int32 { return 0 },
		descSetAttribute: func(_ uintptr, attr int32, buf unsafe.Pointer, size uint64) int32 {
			trans = append(trans, attr, *(*int32)(buf))
			return 0
		},
		layoutCreate: func(l *uintptr, ty int32, rows, cols uint64, ld int64) int32 {
			layouts = append(layouts, layout{ty, rows, cols, ld})
			*l = next
			next++
			return 0
		},
		layoutDestroy: func(uintptr) int32 { return 0 },
		matmul: func(h, desc uintptr, alpha unsafe.Pointer, a devPtr, ad uintptr, bb devPtr, bd uintptr, beta unsafe.Pointer, c devPtr, cd uintptr, d devPtr, dd uintptr, algo uintptr, ws devPtr, wsSize uint64, s cuStream) int32 {
			matmuls++
			if *(*float32)(alpha) != 1 || *(*float32)(beta) != 0 || c != d || cd != dd || a == 0 || bb == 0 || ws == 0 && wsSize != 0 {
				t.Errorf("matmul arguments: alpha %v beta %v", *(*float32)(alpha), *(*float32)(beta))
			}
			return 0
		},
	}
	b.lt.ws = b.alloc(ltWorkspace)
	const T, O, I = 5, 96, 64
	x, y := b.NewTensor(T, I), b.NewTensor(T, O)
	for _, f := range []kernels.Format{kernels.BF16, kernels.MXFP4, kernels.F32} {
		w := conformance.RandomMatrix(1, "w", f, O, I)
		if err := b.Bind(w); err != nil {
			t.Fatal(err)
		}
		b.MatMul(y, x, w)
	}
	if matmuls != 2 || launched["gemm.tandem_gemm_f32"] != 1 || launched["gemm.tandem_gemm_bf16"] != 0 {
		t.Fatalf("%d cuBLASLt calls, launches %v", matmuls, launched)
	}
	// Activations twice (BF16 and MX), the MX weight once.
	if launched["elementwise.tandem_dequant_bf16"] != 3 {
		t.Errorf("dequant_bf16 launched %d times, want 3", launched["elementwise.tandem_dequant_bf16"])
	}
	want := []layout{{cudaR16BF, I, O, I}, {cudaR16BF, I, T, I}, {cudaR32F, O, T, O}}
	for i, l := range layouts {
		if l != want[i%3] {
			t.Errorf("layout %d: %+v, want %+v", i, l, want[i%3])
		}
	}
	if len(trans) != 8 || trans[0] != ltDescTransA || trans[1] != cublasOpT || trans[2] != ltDescTransB || trans[3] != cublasOpN {
		t.Errorf("transposes %v", trans)
	}
}

// fits says whether a launch argument matches a PTX parameter type.
func fits(a any, ty string) bool {
	switch a.(type) {
	case devPtr, i64:
		return ty == "u64" || ty == "b64" || ty == "s64"
	case i32:
		return ty == "u32" || ty == "b32" || ty == "s32"
	case f32:
		return ty == "f32" || ty == "b32"
	}
	return false
}

// TestLaunchesMatchThePTX runs every op of the backend on a fake driver and
// checks each launch against the kernel's parameters in the embedded PTX:
// the kernel exists in the named module and every argument has its
// parameter's width and kind. (The driver would otherwise read a wrong
// parameter block silently.) Every kernel of the contract is launched.
func TestLaunchesMatchThePTX(t *testing.T) {
	b, launched := fakeBackend(t)
	run := func(name string, fn func()) {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("%s panicked: %v", name, p)
			}
		}()
		fn()
	}
	T, d := 8, 64
	x, y := b.NewTensor(T, d), b.NewTensor(T, d)
	for _, f := range []kernels.Format{kernels.BF16, kernels.F32, kernels.MXFP4, kernels.MXFP8E4M3} {
		w := conformance.RandomMatrix(1, "w", f, 32, d)
		run("Bind", func() {
			if err := b.Bind(w); err != nil {
				t.Fatal(err)
			}
		})
		run("MatMul "+f.String(), func() { b.MatMul(b.NewTensor(T, 32), x, w) })
	}
	tab := conformance.RandomMatrix(1, "embed", kernels.BF16, 16, d)
	b.Bind(tab)
	run("Embed", func() { b.Embed(x, tab, []int32{0, 1, 2, 3, 4, 5, 6, 15}) })
	run("RMSNorm", func() { b.RMSNorm(y, x, make([]float32, d), 0, 1e-5) })
	run("L2NormGroups", func() { b.L2NormGroups(x, 32, 1e-6, 1) })
	run("Add", func() { b.Add(y, x, y) })
	run("AddBias", func() { b.AddBias(x, make([]float32, d)) })
	run("Sigmoid", func() { b.Sigmoid(x) })
	run("MulSigmoid", func() { b.MulSigmoid(x, y) })
	run("AttnResMix", func() { b.AttnResMix(y, []*kernels.Tensor{x, y}, make([]float32, d), 1e-6) })
	run("KDAGate", func() { b.KDAGate(x, make([]float32, 2), 32, -5) })
	run("CopyBlock", func() { b.CopyBlock(y, 0, 0, x, 1, 0, 4, 32) })
	gate, up, down := conformance.RandomMatrix(2, "g", kernels.BF16, 96, d), conformance.RandomMatrix(3, "u", kernels.BF16, 96, d), conformance.RandomMatrix(4, "d", kernels.BF16, d, 96)
	for _, m := range []*kernels.Matrix{gate, up, down} {
		b.Bind(m)
	}
	run("SiTUMLP", func() { b.SiTUMLP(y, x, gate, up, down, 4, 25) })
	conv := &kernels.Tensor{Rows: d, Cols: 4, Data: make([]float32, 4*d)}
	run("ShortConvSiLU", func() {
		tail := b.AttachState(make([]float32, 3*d), d, 3)
		b.ShortConvSiLU(y, x, kernels.Span{Lo: 0, Hi: T}, conv, tail)
		b.DetachState(tail, make([]float32, 3*d))
	})
	run("KDA", func() {
		S := b.AttachState(make([]float32, 2*32*32), 64, 32)
		b.KDA(y, x, x, x, x, b.NewTensor(T, 2), kernels.Span{Lo: 0, Hi: T}, S, 2, 32, 32, 64)
		b.DetachState(S, make([]float32, 2*32*32))
	})
	H, nope, rope, vdim, lora := 2, 16, 8, 16, 32
	kvb := conformance.RandomMatrix(5, "kvb", kernels.BF16, H*(nope+vdim), lora)
	b.Bind(kvb)
	run("WriteLatent+MLAAttention", func() {
		c := &kernels.LatentCache{Rows: 20, Cols: lora + rope, BF16: make([]uint16, 20*(lora+rope))}
		b.AttachLatent(c, 12)
		b.WriteLatent(c, 12, b.NewTensor(T, lora+rope), 0, T)
		b.MLAAttention(b.NewTensor(T, H*vdim), b.NewTensor(T, H*(nope+rope)), kernels.Span{Lo: 0, Hi: T}, c, kvb, H, nope, rope, vdim, 0.1, false)
		b.DetachLatent(c, 12)
	})
	ids, wts := make([]int32, T*2), make([]float32, T*2)
	run("RouterTopK", func() { b.RouterTopK(b.NewTensor(T, 16), make([]float32, 16), 2, true, 1, ids, wts) })
	ex := make([]kernels.Expert, 4)
	for e := range ex {
		ex[e] = kernels.Expert{W1: conformance.RandomMatrix(6, "w1", kernels.MXFP4, 64, 32), W3: conformance.RandomMatrix(7, "w3", kernels.MXFP4, 64, 32),
			W2: conformance.RandomMatrix(8, "w2", kernels.MXFP4, 32, 64)}
		b.Bind(ex[e].W1)
		b.Bind(ex[e].W3)
		b.Bind(ex[e].W2)
	}
	for i := range ids {
		ids[i] = int32(i % 4)
	}
	run("RoutedExperts", func() { b.RoutedExperts(b.NewTensor(T, 32), b.NewTensor(T, 32), ids, wts, 2, ex, 4, 25) })

	var missing []string
	for _, k := range []string{"elementwise.tandem_add", "elementwise.tandem_add_bias", "elementwise.tandem_sigmoid", "elementwise.tandem_mul_sigmoid",
		"elementwise.tandem_situ", "elementwise.tandem_kda_gate", "elementwise.tandem_gather_rows", "elementwise.tandem_embed", "elementwise.tandem_moe_combine",
		"elementwise.tandem_write_latent", "norm.tandem_rmsnorm", "norm.tandem_l2norm_groups", "norm.tandem_attnres_mix", "gemm.tandem_gemm_bf16",
		"gemm.tandem_gemm_bf16_grouped", "gemm.tandem_gemm_f32", "conv.tandem_short_conv_silu", "router.tandem_router_topk", "kda.tandem_kda_chunked",
		"mla.tandem_mla_split_cache", "mla.tandem_mla_attn_mma"} {
		if launched[k] == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("kernels never launched: %s", strings.Join(missing, ", "))
	}
	t.Logf("launches: %v", fmt.Sprint(launched))
}
