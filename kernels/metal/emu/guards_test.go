package emu

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/kernels/metal"
)

// pack is a kernel's constant struct: 4-byte fields.
func pack(vals ...any) metal.Arg {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		switch x := v.(type) {
		case int:
			binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
		case float32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
	}
	return metal.Arg{Bytes: b}
}

func f32At(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }

// TestKernelGuards: a dispatch past a kernel's fixed arrays (a launcher
// slip the backend checks first) writes NaN or −1 instead of writing out of
// bounds, and a malformed dispatch is an error from the driver, not a
// crash of the test.
func TestKernelGuards(t *testing.T) {
	bin, _ := drivers(t)
	dev, err := Open(bin, nil, dispatchTime)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	buf := func(n int) metal.Buffer {
		b, err := dev.NewBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tg := [3]int{256, 1, 1}

	// KDA with dk = 200 > 128: NaN outputs.
	H, dk, dv := 1, 200, 64
	o, x, S := buf(4*H*dv), buf(4*H*dk), buf(4*H*dk*dv)
	beta := buf(4 * H)
	if err := dev.Dispatch("tandem_kda_recurrent", [3]int{H, 1, 1}, [3]int{64, 1, 1}, metal.Arg{Buf: o, Write: true}, metal.Arg{Buf: x}, metal.Arg{Buf: x},
		metal.Arg{Buf: o}, metal.Arg{Buf: x}, metal.Arg{Buf: beta}, metal.Arg{Buf: S, Write: true}, pack(0, 1, H, dk, dv), metal.Arg{Threadgroup: 4 * dk}); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < dv; j++ {
		if v := f32At(o.Bytes(), j); !math.IsNaN(float64(v)) {
			t.Fatalf("kda with dk %d: output %d = %g, want NaN", dk, j, v)
		}
	}

	// Router with k = 40 > 32: ids −1 and NaN weights.
	E, k := 64, 40
	lg, bias, ids, w := buf(4*E), buf(4*E), buf(4*k), buf(4*k)
	if err := dev.Dispatch("tandem_router_topk", [3]int{1, 1, 1}, [3]int{128, 1, 1}, metal.Arg{Buf: lg}, metal.Arg{Buf: bias},
		metal.Arg{Buf: ids, Write: true}, metal.Arg{Buf: w, Write: true}, pack(1, E, k, 1, float32(1))); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < k; j++ {
		if id := int32(binary.LittleEndian.Uint32(ids.Bytes()[4*j:])); id != -1 || !math.IsNaN(float64(f32At(w.Bytes(), j))) {
			t.Fatalf("router with k %d: slot %d id %d weight %g", k, j, id, f32At(w.Bytes(), j))
		}
	}

	// Conv with K = 9 > 8: NaN outputs.
	P, K := 32, 9
	cx, cw, tail := buf(4*P), buf(4*P*K), buf(4*P*(K-1))
	if err := dev.Dispatch("tandem_short_conv_silu", [3]int{1, 1, 1}, tg, metal.Arg{Buf: cx, Write: true}, metal.Arg{Buf: cx}, metal.Arg{Buf: cw},
		metal.Arg{Buf: tail, Write: true}, pack(0, 1, P, K)); err != nil {
		t.Fatal(err)
	}
	if v := f32At(cx.Bytes(), 0); !math.IsNaN(float64(v)) {
		t.Fatalf("conv with K %d: %g, want NaN", K, v)
	}

	// Malformed dispatches: the driver names what is wrong and exits; the
	// device reports it as an error.
	for _, c := range []struct {
		kernel string
		args   []metal.Arg
		want   string
	}{
		{"tandem_nope", nil, "unknown kernel tandem_nope"},
		{"tandem_sigmoid", []metal.Arg{{Buf: cx, Write: true}}, "1 arguments, the kernel takes 2"},
		{"tandem_sigmoid", []metal.Arg{{Buf: cx, Write: true}, pack(1, 2)}, "wants 4 constant bytes, given 8"},
	} {
		d, err := Open(bin, nil, dispatchTime)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := d.NewBuffer(4)
		args := c.args
		for i := range args {
			if args[i].Buf != nil {
				args[i].Buf = b
			}
		}
		err = d.Dispatch(c.kernel, [3]int{1, 1, 1}, tg, args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %d args: %v, want %q", c.kernel, len(c.args), err, c.want)
		}
		d.Close()
	}
}
