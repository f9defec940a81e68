package executor

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
)

// EmbedName is the released name of the embedding table.
const EmbedName = "language_model.model.embed_tokens.weight"

// Embedder reads the embedding rows of a pass's tokens with positioned reads
// of the shard, instead of streaming the whole table (prefill needs no
// lm_head and only the prompt's rows of the embedding).
type Embedder struct {
	File     string
	Offset   int64 // of row 0
	Rows     int   // vocabulary
	Cols     int
	Format   kernels.Format
	RowBytes int
}

// NewEmbedder locates the embedding table in the checkpoint and checks it
// against the config. Only dense tables (BF16, F16, F32) can be read by rows.
func NewEmbedder(ck *safetensors.Checkpoint, c *model.Config) (*Embedder, error) {
	t, ok := ck.Tensor(EmbedName)
	if !ok {
		return nil, fmt.Errorf("embedding: tensor %s is missing (a quantized table, %s_packed, cannot be read by rows)", EmbedName, EmbedName)
	}
	e := &Embedder{File: t.File, Offset: t.Offset}
	switch t.DType {
	case safetensors.BF16:
		e.Format = kernels.BF16
	case safetensors.F16:
		e.Format = kernels.F16
	case safetensors.F32:
		e.Format = kernels.F32
	default:
		return nil, fmt.Errorf("embedding: %s has dtype %s; want BF16, F16 or F32", EmbedName, t.DType)
	}
	if len(t.Shape) != 2 || int(t.Shape[0]) != c.VocabSize || int(t.Shape[1]) != c.HiddenSize {
		return nil, fmt.Errorf("embedding: %s has shape %v; the config needs [%d, %d]", EmbedName, t.Shape, c.VocabSize, c.HiddenSize)
	}
	e.Rows, e.Cols = c.VocabSize, c.HiddenSize
	e.RowBytes = e.Format.RowBytes(e.Cols)
	return e, nil
}

// Table reads the rows of the distinct ids into a small table and returns
// it with ids renumbered into it: Embed over (table, local) gives exactly
// the rows Embed over the full table would.
func (e *Embedder) Table(ids []int32) (*kernels.Matrix, []int32, error) {
	uniq := slices.Clone(ids)
	slices.Sort(uniq)
	uniq = slices.Compact(uniq)
	for _, id := range uniq {
		if id < 0 || int(id) >= e.Rows {
			return nil, nil, fmt.Errorf("embedding: token id %d is outside the vocabulary [0, %d)", id, e.Rows)
		}
	}
	f, err := os.Open(e.File)
	if err != nil {
		return nil, nil, fmt.Errorf("embedding: %w", err)
	}
	defer f.Close()
	data := make([]byte, len(uniq)*e.RowBytes)
	// Read runs of consecutive ids with one request each.
	for i := 0; i < len(uniq); {
		j := i + 1
		for j < len(uniq) && uniq[j] == uniq[j-1]+1 {
			j++
		}
		off := e.Offset + int64(uniq[i])*int64(e.RowBytes)
		if _, err := f.ReadAt(data[i*e.RowBytes:j*e.RowBytes], off); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, fmt.Errorf("embedding: reading rows %d-%d of %s at byte %d: %w", uniq[i], uniq[j-1], e.File, off, err)
		}
		i = j
	}
	local := make([]int32, len(ids))
	for i, id := range ids {
		k, _ := slices.BinarySearch(uniq, id)
		local[i] = int32(k)
	}
	m := &kernels.Matrix{Name: "language_model.model.embed_tokens", Rows: len(uniq), Cols: e.Cols, Format: e.Format, Data: data}
	return m, local, nil
}
