package vision

// Merge (the released sd2_tpool): after the final norm, an image's h x w
// grid of rows is cut into (h/kh) x (w/kw) groups of kh x kw patches, taken
// row-major over the groups; each group becomes one row holding its
// patches' vectors concatenated in (dy, dx) order, dy the row within the
// group. (The released code also mean-pools over time; an image has one
// frame, so that is the identity.)

// mergeGroups turns one image's rows x [h*w, d] into [(h/kh)*(w/kw), kh*kw*d].
func mergeGroups(x []float32, h, w, d, kh, kw int) []float32 {
	gw := w / kw
	out := make([]float32, 0, len(x))
	for gy := 0; gy < h/kh; gy++ {
		for gx := 0; gx < gw; gx++ {
			for dy := 0; dy < kh; dy++ {
				for dx := 0; dx < kw; dx++ {
					p := (gy*kh+dy)*w + gx*kw + dx
					out = append(out, x[p*d:(p+1)*d]...)
				}
			}
		}
	}
	return out
}
