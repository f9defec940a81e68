package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// WriteTensor is one tensor for WriteFile.
type WriteTensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
	// Fill produces the bytes when Data is nil, so that tensors larger than
	// memory can be streamed; it must write exactly the tensor's byte size.
	Fill func(w io.Writer) error
}

// WriteFile writes a safetensors file holding tensors, their data in the
// given order, with optional metadata. The header is padded with spaces so
// that the data starts at a multiple of 8 bytes. Every tensor's byte count
// is checked against its shape and dtype; the file is written under a
// temporary name and renamed into place, so a failed write leaves nothing
// behind.
func WriteFile(path string, tensors []WriteTensor, metadata map[string]string) error {
	hdr, sizes, err := buildHeader(tensors, metadata, false)
	if err != nil {
		return &Error{File: path, Tensor: err.tensor, Err: err.err}
	}
	return writeAtomic(path, -1, func(w io.Writer) error {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
		if _, err := w.Write(append(n[:], hdr...)); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		for i, t := range tensors {
			if t.Data != nil {
				if _, err := w.Write(t.Data); err != nil {
					return fmt.Errorf("writing %s: %w", path, err)
				}
				continue
			}
			if sizes[i] == 0 {
				continue
			}
			lw := &exactWriter{w: w, left: sizes[i]}
			if err := t.Fill(lw); err != nil {
				return &Error{File: path, Tensor: t.Name, Err: fmt.Errorf("filling: %w", err)}
			}
			if lw.left != 0 {
				return &Error{File: path, Tensor: t.Name, Err: fmt.Errorf("%w: Fill wrote %d of %d bytes", ErrShape, sizes[i]-lw.left, sizes[i])}
			}
		}
		return nil
	})
}

// WriteSparse writes a safetensors file with the same header WriteFile
// would write, but every tensor's data left as a hole: the header is
// written and the file extended to its full size, so its data reads as
// zeros and, where the filesystem has sparse files, takes no disk blocks.
// It lays out checkpoints at full size with no weights (planning and
// streaming at a real model's shapes); tensors must carry neither Data nor
// Fill.
func WriteSparse(path string, tensors []WriteTensor, metadata map[string]string) error {
	hdr, sizes, err := buildHeader(tensors, metadata, true)
	if err != nil {
		return &Error{File: path, Tensor: err.tensor, Err: err.err}
	}
	size := int64(8 + len(hdr))
	for _, n := range sizes {
		size += n
	}
	return writeAtomic(path, size, func(w io.Writer) error {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
		if _, err := w.Write(append(n[:], hdr...)); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		return nil
	})
}

// buildHeader validates the tensors and returns the padded header JSON and
// each tensor's byte size. With holes, tensors must have no data (WriteSparse).
func buildHeader(tensors []WriteTensor, metadata map[string]string, holes bool) ([]byte, []int64, *tensorError) {
	type record struct {
		DType       DType    `json:"dtype"`
		Shape       []int64  `json:"shape"`
		DataOffsets [2]int64 `json:"data_offsets"`
	}
	var b, scratch bytes.Buffer
	enc := json.NewEncoder(&scratch)
	enc.SetEscapeHTML(false) // keep names byte for byte as given
	put := func(v any) {
		scratch.Reset()
		_ = enc.Encode(v) // a string, a map of strings or a record cannot fail
		b.Write(bytes.TrimSuffix(scratch.Bytes(), []byte("\n")))
	}
	b.WriteByte('{')
	if len(metadata) > 0 {
		put(metadataKey)
		b.WriteByte(':')
		put(metadata)
	}
	sizes := make([]int64, len(tensors))
	seen := make(map[string]bool, len(tensors))
	var off int64
	for i, t := range tensors {
		fail := func(err error) ([]byte, []int64, *tensorError) { return nil, nil, &tensorError{t.Name, err} }
		switch {
		case t.Name == "" || t.Name == metadataKey:
			return fail(fmt.Errorf("%w: %q cannot name a tensor", ErrSyntax, t.Name))
		case seen[t.Name]:
			return fail(fmt.Errorf("%w: the name is given twice", ErrDuplicate))
		}
		seen[t.Name] = true
		size, err := byteSize(t.DType, t.Shape)
		switch {
		case err != nil:
			return fail(err)
		case t.Data != nil && int64(len(t.Data)) != size:
			return fail(fmt.Errorf("%w: shape %v of %s needs %d bytes, Data holds %d", ErrShape, t.Shape, t.DType, size, len(t.Data)))
		case holes && (t.Data != nil || t.Fill != nil):
			return fail(fmt.Errorf("%w: a sparse file's tensors are holes, but this one has Data or Fill", ErrShape))
		case !holes && t.Data == nil && t.Fill == nil && size != 0:
			return fail(fmt.Errorf("%w: neither Data nor Fill for %d bytes", ErrShape, size))
		}
		sizes[i] = size
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		put(t.Name)
		b.WriteByte(':')
		shape := t.Shape
		if shape == nil {
			shape = []int64{} // a scalar's shape is [], not null
		}
		put(record{t.DType, shape, [2]int64{off, off + size}})
		off += size
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	if b.Len() > MaxHeaderSize {
		return nil, nil, &tensorError{"", fmt.Errorf("%w: the header would be %d bytes, over the limit of %d", ErrHeaderSize, b.Len(), MaxHeaderSize)}
	}
	return slices.Clip(b.Bytes()), sizes, nil
}

// exactWriter passes at most left bytes through and refuses the rest.
type exactWriter struct {
	w    io.Writer
	left int64
}

func (e *exactWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > e.left {
		return 0, fmt.Errorf("%w: Fill wrote past the tensor's end (%d bytes left, %d offered)", ErrShape, e.left, len(p))
	}
	n, err := e.w.Write(p)
	e.left -= int64(n)
	return n, err
}
