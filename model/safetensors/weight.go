package safetensors

import (
	"fmt"
	"strconv"
)

// Format is how a weight matrix is stored.
type Format int

const (
	Dense Format = iota // one float element per weight (BF16, F16, F32, F64, or FP8 without block scales)
	MXFP4               // weight_packed U8 [R, C/2] (two E2M1 per byte, even column low) + weight_scale [R, C/32]
	MXFP8               // weight F8_E4M3 or F8_E5M2 [R, C] + weight_scale [R, C/32]
)

func (f Format) String() string {
	switch f {
	case Dense:
		return "dense"
	case MXFP4:
		return "mxfp4"
	case MXFP8:
		return "mxfp8"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// Weight is a weight matrix with its storage format resolved.
type Weight struct {
	Name       string // base name, e.g. "...experts.3.w1" or "...q_proj"
	Format     Format
	Rows, Cols int         // logical [out, in]
	Data       TensorInfo  // base.weight, or base.weight_packed for MXFP4
	Scale      *TensorInfo // base.weight_scale (E8M0 bytes) for MXFP4 and MXFP8
}

// Weight resolves the weight called base from the headers alone:
//
//   - base.weight_packed (U8 [R, C/2]) with base.weight_scale (U8 or
//     F8_E8M0 [R, C/32]) is MXFP4 with C columns;
//   - base.weight of F8_E4M3 or F8_E5M2 [R, C] with base.weight_scale
//     (U8 or F8_E8M0 [R, C/32]) is MXFP8;
//   - base.weight of a float dtype without a scale is dense. A dense weight
//     of rank 2 or more has Rows = Shape[0] and Cols the product of the
//     rest; a vector is one row; a scalar is 1 x 1.
//
// C must be a multiple of 32 for the MX formats. Anything else (both
// weight and weight_packed, a scale of another dtype or shape, a scale next
// to a BF16 weight, an integer weight) is an error naming the tensor.
func (c *Checkpoint) Weight(base string) (Weight, error) {
	w, hasW := c.tensors[base+".weight"]
	p, hasP := c.tensors[base+".weight_packed"]
	s, hasS := c.tensors[base+".weight_scale"]
	fail := func(e entry, err error) (Weight, error) {
		return Weight{}, &Error{File: e.shard.path, Tensor: e.info.Name, Err: err}
	}
	switch {
	case c.closed.Load():
		return Weight{}, &Error{File: c.Dir, Tensor: base, Err: ErrClosed}
	case hasW && hasP:
		return fail(p, fmt.Errorf("%w: both %s.weight and %s.weight_packed exist", ErrFormat, base, base))
	case hasP:
		if !hasS {
			return fail(p, fmt.Errorf("%w: an MXFP4 weight needs %s.weight_scale, which no shard holds", ErrMissing, base))
		}
		if p.info.DType != U8 || len(p.info.Shape) != 2 {
			return fail(p, fmt.Errorf("%w: weight_packed is %s %v, want U8 [rows, cols/2]", ErrFormat, p.info.DType, p.info.Shape))
		}
		rows, cols := p.info.Shape[0], 2*p.info.Shape[1]
		if err := checkScale(s, rows, cols); err != nil {
			return fail(s, err)
		}
		return newWeight(base, MXFP4, rows, cols, p, &s), nil
	case !hasW:
		return Weight{}, &Error{File: c.Dir, Tensor: base, Err: fmt.Errorf("%w: no %s.weight or %s.weight_packed", ErrMissing, base, base)}
	case hasS:
		if dt := w.info.DType; dt != F8E4M3 && dt != F8E5M2 {
			return fail(s, fmt.Errorf("%w: a weight_scale next to a %s weight is no format this reader knows (MXFP8 needs an FP8 weight)", ErrFormat, dt))
		}
		if len(w.info.Shape) != 2 {
			return fail(w, fmt.Errorf("%w: an MXFP8 weight must be 2-D, it is %v", ErrFormat, w.info.Shape))
		}
		rows, cols := w.info.Shape[0], w.info.Shape[1]
		if err := checkScale(s, rows, cols); err != nil {
			return fail(s, err)
		}
		return newWeight(base, MXFP8, rows, cols, w, &s), nil
	case !w.info.DType.IsFloat():
		return fail(w, fmt.Errorf("%w: a dense weight of dtype %s (want a float dtype)", ErrFormat, w.info.DType))
	}
	rows, cols := int64(1), int64(1)
	switch sh := w.info.Shape; len(sh) {
	case 0:
	case 1:
		cols = sh[0]
	default: // byteSize has bounded the product of the non-zero dimensions
		rows = sh[0]
		for _, d := range sh[1:] {
			cols *= d
		}
	}
	return newWeight(base, Dense, rows, cols, w, nil), nil
}

// checkScale checks an E8M0 scale tensor for a logical [rows, cols] weight.
func checkScale(s entry, rows, cols int64) error {
	if s.info.DType != U8 && s.info.DType != F8E8M0 {
		return fmt.Errorf("%w: weight_scale is %s, want U8 (E8M0) block scales", ErrFormat, s.info.DType)
	}
	if cols%32 != 0 {
		return fmt.Errorf("%w: the weight has %d columns, not a multiple of the block of 32", ErrFormat, cols)
	}
	if len(s.info.Shape) != 2 || s.info.Shape[0] != rows || s.info.Shape[1] != cols/32 {
		return fmt.Errorf("%w: weight_scale shape %v, want [%d, %d] for a [%d, %d] weight", ErrFormat, s.info.Shape, rows, cols/32, rows, cols)
	}
	return nil
}

func newWeight(base string, f Format, rows, cols int64, data entry, scale *entry) Weight {
	w := Weight{Name: base, Format: f, Rows: int(rows), Cols: int(cols), Data: data.info}
	w.Data.Shape = append([]int64(nil), data.info.Shape...)
	if scale != nil {
		s := scale.info
		s.Shape = append([]int64(nil), s.Shape...)
		w.Scale = &s
	}
	return w
}
