package vision

import "math"

// An fp64 reference of the tower, written from the description in
// docs/K3.md without the package's code: plain loops over explicit indices,
// float64 everywhere, the 4-D conv kernel indexed as [o][c][y][x].

type ref struct {
	c *Config
	w map[string]tensor
}

func (r ref) vec(name string) []float64 {
	v := r.w[name].vals
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// linear is y[t][o] = Σ_i x[t][i] W[o][i] for W [out, in] stored row-major.
func (r ref) linear(name string, x [][]float64) [][]float64 {
	W := r.vec(name)
	in := len(x[0])
	out := len(W) / in
	y := make([][]float64, len(x))
	for t := range x {
		y[t] = make([]float64, out)
		for o := 0; o < out; o++ {
			var s float64
			for i := 0; i < in; i++ {
				s += x[t][i] * W[o*in+i]
			}
			y[t][o] = s
		}
	}
	return y
}

func refRMSNorm(x [][]float64, w []float64, eps float64) [][]float64 {
	y := make([][]float64, len(x))
	for t, row := range x {
		var ss float64
		for _, v := range row {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(row))+eps)
		y[t] = make([]float64, len(row))
		for i, v := range row {
			y[t][i] = w[i] * v * inv
		}
	}
	return y
}

// patchEmbed convolves each patch with the [D, 3, P, P] kernel.
func (r ref) patchEmbed(p Patches) [][]float64 {
	P, D := r.c.Patch, r.c.Hidden
	W := r.vec(namePatchEmbed)
	n := p.GridH * p.GridW
	x := make([][]float64, n)
	for t := 0; t < n; t++ {
		x[t] = make([]float64, D)
		for o := 0; o < D; o++ {
			var s float64
			for ch := 0; ch < 3; ch++ {
				for y := 0; y < P; y++ {
					for xx := 0; xx < P; xx++ {
						s += W[((o*3+ch)*P+y)*P+xx] * float64(p.Pixels[((t*3+ch)*P+y)*P+xx])
					}
				}
			}
			x[t][o] = s
		}
	}
	return x
}

// srcCoord is the half-pixel-centre source coordinate of output index o.
func srcCoord(o, in, out int) float64 {
	s := (float64(o)+0.5)*float64(in)/float64(out) - 0.5
	return math.Max(s, 0)
}

// posTable resamples the table to h x w: [h*w][D].
func (r ref) posTable(h, w int) [][]float64 {
	c := r.c
	T := r.vec(namePosEmb)
	at := func(y, x, k int) float64 { return T[(y*c.PosW+x)*c.Hidden+k] }
	out := make([][]float64, h*w)
	for oy := 0; oy < h; oy++ {
		for ox := 0; ox < w; ox++ {
			row := make([]float64, c.Hidden)
			if h == c.PosH && w == c.PosW {
				for k := range row {
					row[k] = at(oy, ox, k)
				}
				out[oy*w+ox] = row
				continue
			}
			sy, sx := srcCoord(oy, c.PosH, h), srcCoord(ox, c.PosW, w)
			y0, x0 := int(math.Floor(sy)), int(math.Floor(sx))
			y1, x1 := min(y0+1, c.PosH-1), min(x0+1, c.PosW-1)
			fy, fx := sy-float64(y0), sx-float64(x0)
			for k := range row {
				row[k] = (1-fy)*((1-fx)*at(y0, x0, k)+fx*at(y0, x1, k)) + fy*((1-fx)*at(y1, x0, k)+fx*at(y1, x1, k))
			}
			out[oy*w+ox] = row
		}
	}
	return out
}

// rope rotates one head vector of patch (y, x): complex number c turns by
// (x if c is even, else y) · base^(−4⌊c/2⌋/hd).
func refRope(v []float64, y, x int, base float64) {
	hd := len(v)
	for c := 0; c < hd/2; c++ {
		pos := float64(x)
		if c%2 == 1 {
			pos = float64(y)
		}
		a := pos * math.Pow(base, -4*float64(c/2)/float64(hd))
		re, im := v[2*c], v[2*c+1]
		v[2*c] = re*math.Cos(a) - im*math.Sin(a)
		v[2*c+1] = re*math.Sin(a) + im*math.Cos(a)
	}
}

// attention runs rope and full attention over one image's qkv rows.
func (r ref) attention(qkv [][]float64, h, w int) [][]float64 {
	c := r.c
	hd, n := c.HeadDim(), len(qkv)
	out := make([][]float64, n)
	for t := range out {
		out[t] = make([]float64, c.QKV)
	}
	for head := 0; head < c.Heads; head++ {
		q := make([][]float64, n)
		k := make([][]float64, n)
		for t := 0; t < n; t++ {
			q[t] = append([]float64(nil), qkv[t][head*hd:(head+1)*hd]...)
			k[t] = append([]float64(nil), qkv[t][c.QKV+head*hd:c.QKV+(head+1)*hd]...)
			refRope(q[t], t/w, t%w, c.RopeTheta)
			refRope(k[t], t/w, t%w, c.RopeTheta)
		}
		for t := 0; t < n; t++ {
			s := make([]float64, n)
			m := math.Inf(-1)
			for u := 0; u < n; u++ {
				for e := 0; e < hd; e++ {
					s[u] += q[t][e] * k[u][e]
				}
				s[u] /= math.Sqrt(float64(hd))
				m = math.Max(m, s[u])
			}
			var z float64
			for u := range s {
				s[u] = math.Exp(s[u] - m)
				z += s[u]
			}
			for u := 0; u < n; u++ {
				for e := 0; e < hd; e++ {
					out[t][head*hd+e] += s[u] / z * qkv[u][2*c.QKV+head*hd+e]
				}
			}
		}
	}
	return out
}

func refGELUTanh(v float64) float64 {
	return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
}

func refGELUErf(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }

func addInPlace(x, y [][]float64) {
	for t := range x {
		for i := range x[t] {
			x[t][i] += y[t][i]
		}
	}
}

func mapAll(x [][]float64, f func(float64) float64) {
	for _, row := range x {
		for i := range row {
			row[i] = f(row[i])
		}
	}
}

// block runs encoder block i over one image's rows.
func (r ref) block(i int, x [][]float64, h, w int) {
	pre, eps := BlockPrefix(i), float64(r.c.NormEps)
	a := r.attention(r.linear(pre+"wqkv.weight", refRMSNorm(x, r.vec(pre+"norm0.weight"), eps)), h, w)
	addInPlace(x, r.linear(pre+"wo.weight", a))
	m := r.linear(pre+"mlp.fc0.weight", refRMSNorm(x, r.vec(pre+"norm1.weight"), eps))
	mapAll(m, refGELUTanh)
	addInPlace(x, r.linear(pre+"mlp.fc1.weight", m))
}

// merge groups 2x2 (kh x kw) patches: row (gy, gx), part (dy, dx).
func (r ref) merge(x [][]float64, h, w int) [][]float64 {
	kh, kw, D := r.c.MergeH, r.c.MergeW, r.c.Hidden
	out := make([][]float64, (h/kh)*(w/kw))
	for g := range out {
		gy, gx := g/(w/kw), g%(w/kw)
		out[g] = make([]float64, kh*kw*D)
		for part := 0; part < kh*kw; part++ {
			dy, dx := part/kw, part%kw
			copy(out[g][part*D:], x[(gy*kh+dy)*w+gx*kw+dx])
		}
	}
	return out
}

func (r ref) project(m [][]float64) [][]float64 {
	y := r.linear(nameProj0, m)
	mapAll(y, refGELUErf)
	return refRMSNorm(r.linear(nameProj2, y), r.vec(namePostNorm), float64(r.c.ProjectorEps))
}

// features is the whole tower for one image, flattened [rows*TextHidden].
func (r ref) features(p Patches) []float64 {
	x := r.patchEmbed(p)
	addInPlace(x, r.posTable(p.GridH, p.GridW))
	for i := 0; i < r.c.Layers; i++ {
		r.block(i, x, p.GridH, p.GridW)
	}
	x = refRMSNorm(x, r.vec(nameFinalNorm), float64(r.c.NormEps))
	return flat(r.project(r.merge(x, p.GridH, p.GridW)))
}

func flat(x [][]float64) []float64 {
	var out []float64
	for _, row := range x {
		out = append(out, row...)
	}
	return out
}
