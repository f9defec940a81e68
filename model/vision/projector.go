package vision

// Projector (the released patchmergerv2): two bias-free linear layers with
// exact GELU between them, then an RMSNorm over the text tower's width:
//
//	y = post_norm(proj.2(gelu(proj.0(merged))))
//
// There is no norm before proj.0 (unlike Kimi K2.5's projector); the post
// norm's eps is projector_ln_eps.

// project maps merged rows [R, MergedWidth] (host values) to [R, TextHidden].
func (t *Tower) project(merged []float32, rows int) []float32 {
	c, be := t.cfg, t.be
	in := upload(be, merged, rows, c.MergedWidth())
	defer be.Free(in)
	mid := be.NewTensor(rows, c.MergedWidth())
	defer be.Free(mid)
	be.MatMul(mid, in, t.w.Proj0)
	hostMap(be, mid, geluErf)
	y := be.NewTensor(rows, c.TextHidden)
	defer be.Free(y)
	be.MatMul(y, mid, t.w.Proj2)
	out := be.NewTensor(rows, c.TextHidden)
	defer be.Free(out)
	be.RMSNorm(out, y, t.w.PostNorm, 0, c.ProjectorEps)
	return download(be, out)
}
