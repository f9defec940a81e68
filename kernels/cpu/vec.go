package cpu

// Portable vector steps of the KDA recurrences. Each element is one
// multiply then one add, each rounded: the product is converted explicitly
// (float64()) so that no compiler fuses the two (Go fuses a*b+c on arm64,
// never on amd64). The amd64 assembly does one VMULPD then one
// VADDPD/VSUBPD per element: the same bits.

func axpyGo(y, x []float64, a float64) {
	x = x[:len(y)]
	for j := range y {
		y[j] += float64(a * x[j])
	}
}

func axmyGo(y, x []float64, a float64) {
	x = x[:len(y)]
	for j := range y {
		y[j] -= float64(a * x[j])
	}
}

func scalGo(y []float64, a float64) {
	for j := range y {
		y[j] *= a
	}
}

func decayReadGo(row, r []float64, a, kc float64) {
	r = r[:len(row)]
	for j := range row {
		row[j] *= a
		r[j] += float64(kc * row[j])
	}
}

func writeReadGo(row, r, acc []float64, kc, qc float64) {
	r, acc = r[:len(row)], acc[:len(row)]
	for j := range row {
		row[j] += float64(kc * r[j])
		acc[j] += float64(qc * row[j])
	}
}

// widenGo sets dst[i] = float64(src[i]) (exact).
func widenGo(dst []float64, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = float64(x)
	}
}

// narrowGo rounds s to fp32 into dst and writes the rounded values back
// into s.
func narrowGo(dst []float32, s []float64) {
	dst = dst[:len(s)]
	for i, x := range s {
		f := float32(x)
		dst[i] = f
		s[i] = float64(f)
	}
}

// matAccGo adds (or, with sub, subtracts) a[r]·mat[r*ld:][:len(y)] to y
// for r in order, skipping rows whose a[r] == 0 when skip is set: the
// row-by-row loops of the KDA chunk form.
func matAccGo(y, a, mat []float64, ld int, sub, skip bool) {
	for r, x := range a {
		if skip && x == 0 {
			continue
		}
		if sub {
			axmyGo(y, mat[r*ld:], x)
		} else {
			axpyGo(y, mat[r*ld:], x)
		}
	}
}
