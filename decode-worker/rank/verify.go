package rank

import (
	"fmt"

	"github.com/tandem-inference/tandem/model"
)

// Verify checks a committed state before any decoding uses it: it holds
// exactly layers [lo, hi), each with the parts, dtypes and shapes of a
// sequence of tokens cached tokens, and every value is finite. kvtransfer
// already checks shapes and checksums on the wire; this also catches a
// sender that computed garbage (NaN or Inf) and any future path that does
// not go through kvtransfer.
func Verify(c *model.Config, st *model.SeqState, lo, hi, tokens int, latent model.DType) error {
	return VerifyShard(c, st, lo, hi, tokens, latent, model.Shard{})
}

// VerifyShard is Verify of tensor rank s's slice of a state.
func VerifyShard(c *model.Config, st *model.SeqState, lo, hi, tokens int, latent model.DType, s model.Shard) error {
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
		if err := c.CheckShardLayerState(ls, L, tokens, latent, s); err != nil {
			return err
		}
	}
	return nil
}
