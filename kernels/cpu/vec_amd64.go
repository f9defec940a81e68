package cpu

// Assembly of vec_amd64.s; the wrappers check lengths the way the Go loops
// would (by slicing) before handing pointers over.

//go:noescape
func scalAVX2(y *float64, n int, a float64)

//go:noescape
func decayReadAVX2(row, r *float64, n int, a, kc float64)

//go:noescape
func writeReadAVX2(row, r, acc *float64, n int, kc, qc float64)

//go:noescape
func matAddAVX2(y *float64, n int, a *float64, m int, mat *float64, ld int, skip bool)

//go:noescape
func matSubAVX2(y *float64, n int, a *float64, m int, mat *float64, ld int, skip bool)

//go:noescape
func widenAVX2(dst *float64, src *float32, n int)

//go:noescape
func narrowAVX2(dst *float32, s *float64, n int)

//go:noescape
func kdaDotsAVX2(l, a, kp, qp, knT *float64, ld, dk, nj int)

func scalVec(y []float64, a float64) {
	if len(y) > 0 {
		scalAVX2(&y[0], len(y), a)
	}
}

func decayReadVec(row, r []float64, a, kc float64) {
	if len(row) > 0 {
		decayReadAVX2(&row[0], &r[:len(row)][0], len(row), a, kc)
	}
}

func writeReadVec(row, r, acc []float64, kc, qc float64) {
	if len(row) > 0 {
		writeReadAVX2(&row[0], &r[:len(row)][0], &acc[:len(row)][0], len(row), kc, qc)
	}
}

func kdaDotsVec(l, a, kp, qp, knT []float64, ld, nj int) {
	dk := len(kp)
	if nj <= 0 || dk == 0 {
		return
	}
	n8 := (nj + 7) &^ 7
	_, _, _ = l[n8-1], a[n8-1], qp[dk-1]
	_ = knT[(dk-1)*ld+n8-1]
	kdaDotsAVX2(&l[0], &a[0], &kp[0], &qp[0], &knT[0], ld, dk, nj)
}

func widenVec(dst []float64, src []float32) {
	n := len(src) &^ 7
	if n > 0 {
		widenAVX2(&dst[:len(src)][0], &src[0], n)
	}
	widenGo(dst[n:], src[n:])
}

func narrowVec(dst []float32, s []float64) {
	n := len(s) &^ 7
	if n > 0 {
		narrowAVX2(&dst[:len(s)][0], &s[0], n)
	}
	narrowGo(dst[n:], s[n:])
}

// matAccVec is matAccGo with 32-element slices of y on the assembly and
// the rest (the same per-element order) in Go.
func matAccVec(y, a, mat []float64, ld int, sub, skip bool) {
	m, n := len(a), len(y)&^31
	if m == 0 {
		return
	}
	_ = mat[(m-1)*ld+len(y)-1]
	if n > 0 {
		if sub {
			matSubAVX2(&y[0], n, &a[0], m, &mat[0], ld, skip)
		} else {
			matAddAVX2(&y[0], n, &a[0], m, &mat[0], ld, skip)
		}
	}
	if n < len(y) {
		matAccGo(y[n:], a, mat[n:], ld, sub, skip)
	}
}
