package rank

import (
	"fmt"
	"math"
	"slices"

	"github.com/tandem-inference/tandem/model"
)

// Verify checks a committed state before any decoding uses it: it holds
// exactly layers [lo, hi), each with the parts, dtypes and shapes of a
// sequence of tokens cached tokens, and every value is finite. kvtransfer
// already checks shapes and checksums on the wire; this also catches a
// sender that computed garbage (NaN or Inf) and any future path that does
// not go through kvtransfer.
func Verify(c *model.Config, st *model.SeqState, lo, hi, tokens int, latent model.DType) error {
	if st == nil {
		return fmt.Errorf("state: none")
	}
	if st.Tokens != tokens {
		return fmt.Errorf("state: %d cached tokens, expected %d", st.Tokens, tokens)
	}
	if len(st.Layers) != c.NumLayers {
		return fmt.Errorf("state: %d layer slots, the model has %d", len(st.Layers), c.NumLayers)
	}
	for L, ls := range st.Layers {
		own := L >= lo && L < hi
		switch {
		case !own && ls != nil:
			return fmt.Errorf("state: layer %d is not on this rank (layers [%d, %d))", L, lo, hi)
		case own && ls == nil:
			return fmt.Errorf("state: layer %d is missing", L)
		case !own:
			continue
		}
		if ls.Layer != L || ls.Kind != c.LayerKind(L) {
			return fmt.Errorf("state: layer %d is labelled layer %d (%s), expected %s", L, ls.Layer, ls.Kind, c.LayerKind(L))
		}
		want := c.ExpectedParts(L, tokens, latent)
		if len(ls.Parts) != len(want) {
			return fmt.Errorf("state: layer %d has %d parts, expected %d", L, len(ls.Parts), len(want))
		}
		for i := range want {
			w, p := &want[i], &ls.Parts[i]
			if p.Kind != w.Kind || p.DType != w.DType || !slices.Equal(p.Shape, w.Shape) {
				return fmt.Errorf("state: layer %d part %d is %s %s %v, expected %s %s %v", L, i, p.Kind, p.DType, p.Shape, w.Kind, w.DType, w.Shape)
			}
			if n := w.Elems() * w.DType.Size(); len(p.Data) != n {
				return fmt.Errorf("state: layer %d part %s has %d bytes, expected %d", L, p.Kind, len(p.Data), n)
			}
			if i, v, ok := nonFinite(p); ok {
				return fmt.Errorf("state: layer %d part %s element %d is %v", L, p.Kind, i, v)
			}
		}
	}
	return nil
}

// nonFinite finds the first NaN or infinite element of a part.
func nonFinite(p *model.Part) (int, float64, bool) {
	switch p.DType {
	case model.F32:
		for i, x := range p.F32() {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return i, float64(x), true
			}
		}
	case model.BF16:
		for i, u := range p.U16() {
			if u&0x7f80 == 0x7f80 { // all exponent bits set: Inf or NaN
				return i, float64(math.Float32frombits(uint32(u) << 16)), true
			}
		}
	}
	return 0, 0, false
}
