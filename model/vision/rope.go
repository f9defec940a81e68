package vision

// 2-D rotary embedding. Each head's width hd is read as hd/2 complex
// numbers (elements 2c and 2c+1 are the real and imaginary parts of number
// c), each rotated by an angle of the patch's grid position: number c = 2j
// turns by x·θ_j and number c = 2j+1 by y·θ_j, for j < hd/4, with x the
// patch's column, y its row and θ_j = base^(−4j/hd). So the pairs alternate
// column, row, column, row, ..., each frequency used once for each axis.
// As in the released code, frequencies and angles are fp32; their cosine
// and sine are taken in fp64 here, with the portable functions.

// ropeTable holds cos and sin [h*w, hd/2] of every patch of an h x w grid.
type ropeTable struct {
	cos, sin []float32
	half     int
}

// newRopeTable computes the angles of an h x w grid for head width hd.
func newRopeTable(h, w, hd int, base float64) ropeTable {
	half := hd / 2
	freqs := make([]float32, hd/4)
	for j := range freqs {
		freqs[j] = float32(ropeFreq(base, float64(float32(4*j)/float32(hd))))
	}
	t := ropeTable{cos: make([]float32, h*w*half), sin: make([]float32, h*w*half), half: half}
	for p := 0; p < h*w; p++ {
		x, y := float32(p%w), float32(p/w)
		for c := 0; c < half; c++ {
			pos := x
			if c%2 == 1 {
				pos = y
			}
			s, co := sinCos(float64(pos * freqs[c/2]))
			t.cos[p*half+c] = float32(co)
			t.sin[p*half+c] = float32(s)
		}
	}
	return t
}

// rotate applies the rotation of patch p to every head of one row of q or
// k (heads x hd values), in place, in fp32 as the released code does.
func (t ropeTable) rotate(row []float32, p int) {
	cs := t.cos[p*t.half : (p+1)*t.half]
	sn := t.sin[p*t.half : (p+1)*t.half]
	for h := 0; h < len(row); h += 2 * t.half {
		v := row[h : h+2*t.half]
		for c := range cs {
			re, im := v[2*c], v[2*c+1]
			// Each product is rounded before the sum (no fused multiply-add),
			// so that amd64 and arm64 agree bit for bit.
			v[2*c] = float32(re*cs[c]) - float32(im*sn[c])
			v[2*c+1] = float32(re*sn[c]) + float32(im*cs[c])
		}
	}
}
