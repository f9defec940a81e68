package emu

import (
	"fmt"
	"math"
	"testing"
)

// TestKernelGuards checks that parameters beyond a kernel's fixed sizes (a
// launcher slip) give NaN outputs instead of writes past shared or local
// arrays, and that KDA's chunk is clamped to the same function.
func TestKernelGuards(t *testing.T) {
	bin, _ := drivers(t)
	e := &env{bin: bin, rng: rngFor(t.Name())}
	t.Run("kda/chunk64-is-chunk16", func(t *testing.T) {
		H, dk, dv, rows := 1, 16, 16, 40
		arrays := map[string][]byte{
			"q": f32Bytes(randF32(e.rng, rows*H*dk, 0.2)), "k": f32Bytes(randF32(e.rng, rows*H*dk, 0.2)),
			"g": f32Bytes(make([]float32, rows*H*dk)), "v": f32Bytes(randF32(e.rng, rows*H*dv, 1)),
			"beta": f32Bytes(randF32(e.rng, rows*H, 0.3)), "S": f32Bytes(randF32(e.rng, H*dk*dv, 0.3)),
		}
		outs := make([]map[string][]byte, 2)
		for i, chunk := range []int{16, 64} {
			out, err := run(bin, call{"kda", p("rows", rows, "lo", 0, "n", rows, "heads", H, "dk", dk, "dv", dv, "chunk", chunk), arrays})
			if err != nil {
				t.Fatal(err)
			}
			outs[i] = out
		}
		for _, name := range []string{"o", "S"} {
			if string(outs[0][name]) != string(outs[1][name]) {
				t.Errorf("%s with chunk 64 differs from chunk 16", name)
			}
		}
	})
	t.Run("router/k-above-32", func(t *testing.T) {
		rows, E, k := 3, 64, 33
		out, err := run(bin, call{"router_topk", p("rows", rows, "E", E, "k", k, "renorm", true, "scale", 1),
			map[string][]byte{"logits": f32Bytes(randF32(e.rng, rows*E, 1)), "bias": f32Bytes(make([]float32, E))}})
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range bytesI32(out["ids"]) {
			if id != -1 {
				t.Fatalf("id %d = %d, want -1", i, id)
			}
		}
		if err := allNaN(bytesF32(out["weights"]), rows*k); err != nil {
			t.Error("weights:", err)
		}
	})
	t.Run("short_conv/K-above-8", func(t *testing.T) {
		rows, P, K := 4, 64, 9
		out, err := run(bin, call{"short_conv_silu", p("rows", rows, "P", P, "K", K, "lo", 0, "n", rows),
			map[string][]byte{"x": f32Bytes(randF32(e.rng, rows*P, 1)), "w": f32Bytes(randF32(e.rng, P*K, 1)), "tail": f32Bytes(randF32(e.rng, P*(K-1), 1))}})
		if err != nil {
			t.Fatal(err)
		}
		if err := allNaN(bytesF32(out["x"]), rows*P); err != nil {
			t.Error(err)
		}
	})
	for _, mma := range []bool{false, true} {
		t.Run(fmt.Sprintf("mla/head-too-wide/mma=%v", mma), func(t *testing.T) {
			// nope+rope = 264 exceeds both kernels' query staging.
			H, nope, rope, vdim, lora, Tc := 1, 256, 8, 16, 32, 10
			cols := lora + rope
			out, err := run(bin, call{"mla", p("rows", Tc, "lo", 0, "n", Tc, "Tc", Tc, "heads", H, "nope", nope, "rope", rope, "vdim", vdim,
				"cols", cols, "bf16", false, "fmt", 1, "scale", 0.1, "key_block", 0, "mma", mma),
				map[string][]byte{"q": f32Bytes(randF32(e.rng, Tc*H*(nope+rope), 1)), "cache": f32Bytes(randF32(e.rng, Tc*cols, 1)),
					"kvb": f32Bytes(randF32(e.rng, H*(nope+vdim)*lora, 0.1)), "kvb_s": nil}})
			if err != nil {
				t.Fatal(err)
			}
			if err := allNaN(bytesF32(out["o"]), Tc*H*vdim); err != nil {
				t.Error(err)
			}
		})
	}
}

func allNaN(v []float32, n int) error {
	if len(v) != n {
		return fmt.Errorf("%d values, want %d", len(v), n)
	}
	for i, x := range v {
		if !math.IsNaN(float64(x)) {
			return fmt.Errorf("value %d = %g, want NaN", i, x)
		}
	}
	return nil
}
