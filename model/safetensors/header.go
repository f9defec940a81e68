package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"unicode/utf8"
)

// MaxHeaderSize bounds the JSON header. The largest real shards (about 5,400
// tensors) have headers under 1 MiB; the bound only stops a hostile length
// from allocating the whole file.
const MaxHeaderSize = 100 << 20

// metadataKey is the header entry that holds free-form string metadata
// instead of a tensor.
const metadataKey = "__metadata__"

// TensorInfo locates one tensor's bytes.
type TensorInfo struct {
	Name   string
	DType  DType
	Shape  []int64
	File   string // path of the shard that holds it
	Offset int64  // absolute byte offset of the tensor's data in File
	Size   int64  // bytes
}

// NumElements returns the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is one shard's parsed and validated header.
type Header struct {
	Tensors   []TensorInfo // sorted by Offset
	Metadata  map[string]string
	DataStart int64 // absolute offset of the data section: 8 + header length
}

// headerEntry is one tensor's header record. Pointers tell a missing field
// from a zero one.
type headerEntry struct {
	DType       *DType   `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// ParseHeader reads and validates the header of the safetensors file of
// fileSize bytes behind r; path is used in errors and as TensorInfo.File.
// It checks the header length against the file and MaxHeaderSize, the JSON
// syntax, duplicate names, dtypes, that each shape times its dtype size
// equals the tensor's byte length, that every tensor lies inside the data
// section and that no two tensors overlap.
func ParseHeader(r io.ReaderAt, fileSize int64, path string) (*Header, error) {
	fail := func(err error) error { return &Error{File: path, Err: err} }
	if fileSize < 8 {
		return nil, fail(fmt.Errorf("%w: the file is %d bytes, too short for the 8-byte header length", ErrHeaderSize, fileSize))
	}
	var lenBuf [8]byte
	// ReadAt may report io.EOF along with a full read that ends the file.
	if k, err := r.ReadAt(lenBuf[:], 0); k < len(lenBuf) {
		return nil, fail(fmt.Errorf("reading the header length: %w", err))
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderSize {
		return nil, fail(fmt.Errorf("%w: header length %d exceeds the limit of %d bytes", ErrHeaderSize, n, MaxHeaderSize))
	}
	if n > uint64(fileSize-8) {
		return nil, fail(fmt.Errorf("%w: header length %d runs past the end of the %d-byte file", ErrHeaderSize, n, fileSize))
	}
	buf := make([]byte, n)
	if k, err := r.ReadAt(buf, 8); k < len(buf) {
		return nil, fail(fmt.Errorf("reading the %d-byte header: %w", n, err))
	}
	return parseHeaderJSON(buf, 8+int64(n), fileSize, path)
}

// parseHeaderJSON decodes the header JSON. It walks the top-level object
// token by token because encoding/json would silently keep the last of two
// entries with the same name.
func parseHeaderJSON(buf []byte, dataStart, fileSize int64, path string) (*Header, error) {
	fail := func(tensor string, err error) error { return &Error{File: path, Tensor: tensor, Err: err} }
	if !utf8.Valid(buf) {
		return nil, fail("", fmt.Errorf("%w: the header is not valid UTF-8", ErrSyntax))
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fail("", fmt.Errorf("%w: the header is not a JSON object (%v)", ErrSyntax, describe(tok, err)))
	}
	h := &Header{DataStart: dataStart}
	dataLen := fileSize - dataStart
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fail("", fmt.Errorf("%w: %w", ErrSyntax, err))
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fail("", fmt.Errorf("%w: unexpected %v where a tensor name belongs", ErrSyntax, tok))
		}
		if seen[name] {
			return nil, fail(name, fmt.Errorf("%w: the name appears twice in the header", ErrDuplicate))
		}
		seen[name] = true
		if name == metadataKey {
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, fail(name, fmt.Errorf("%w: __metadata__ must map strings to strings: %w", ErrSyntax, err))
			}
			continue
		}
		var e headerEntry
		if err := dec.Decode(&e); err != nil {
			return nil, fail(name, fmt.Errorf("%w: %w", ErrSyntax, err))
		}
		t, err := e.validate(name, dataStart, dataLen)
		if err != nil {
			return nil, fail(name, err)
		}
		t.File = path
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fail("", fmt.Errorf("%w: %w", ErrSyntax, err))
	}
	// Writers pad the header with spaces to align the data; nothing else may follow.
	if rest := bytes.TrimLeft(buf[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, fail("", fmt.Errorf("%w: %d bytes of trailing data after the header object", ErrSyntax, len(rest)))
	}
	if err := sortAndCheckOverlap(h.Tensors); err != nil {
		return nil, fail(err.tensor, err.err)
	}
	return h, nil
}

func describe(tok json.Token, err error) string {
	if err != nil {
		if errors.Is(err, io.EOF) {
			return "empty"
		}
		return err.Error()
	}
	return fmt.Sprintf("starts with %v", tok)
}

// validate turns a header record into a TensorInfo after checking it.
func (e *headerEntry) validate(name string, dataStart, dataLen int64) (TensorInfo, error) {
	switch {
	case e.DType == nil:
		return TensorInfo{}, fmt.Errorf("%w: no dtype", ErrSyntax)
	case e.Shape == nil:
		return TensorInfo{}, fmt.Errorf("%w: no shape", ErrSyntax)
	case e.DataOffsets == nil:
		return TensorInfo{}, fmt.Errorf("%w: no data_offsets", ErrSyntax)
	case len(*e.DataOffsets) != 2:
		return TensorInfo{}, fmt.Errorf("%w: data_offsets has %d numbers, want 2", ErrSyntax, len(*e.DataOffsets))
	}
	dt, shape := *e.DType, *e.Shape
	size, err := byteSize(dt, shape)
	if err != nil {
		return TensorInfo{}, err
	}
	begin, end := (*e.DataOffsets)[0], (*e.DataOffsets)[1]
	switch {
	case begin < 0 || end < begin:
		return TensorInfo{}, fmt.Errorf("%w: data_offsets [%d, %d] are not an ascending pair of non-negative numbers", ErrOffsets, begin, end)
	case end-begin != size:
		return TensorInfo{}, fmt.Errorf("%w: shape %v of %s needs %d bytes, data_offsets [%d, %d] span %d", ErrShape, shape, dt, size, begin, end, end-begin)
	case end > dataLen:
		return TensorInfo{}, fmt.Errorf("%w: data_offsets [%d, %d] end past the data section's %d bytes", ErrOffsets, begin, end, dataLen)
	}
	return TensorInfo{Name: name, DType: dt, Shape: shape, Offset: dataStart + begin, Size: size}, nil
}

// byteSize returns the byte length of a tensor, refusing unknown dtypes,
// negative dimensions and products that overflow int64.
func byteSize(dt DType, shape []int64) (int64, error) {
	es := int64(dt.Size())
	if es == 0 {
		return 0, fmt.Errorf("%w %q", ErrDType, dt)
	}
	// Every non-zero dimension enters the overflow check, even when another
	// is zero, so that callers may multiply any subset of them.
	n, zero := es, false
	for _, d := range shape {
		switch {
		case d < 0:
			return 0, fmt.Errorf("%w: shape %v has a negative dimension", ErrShape, shape)
		case d == 0:
			zero = true
		case n > math.MaxInt64/d:
			return 0, fmt.Errorf("%w: shape %v of %s overflows a 64-bit byte count", ErrShape, shape, dt)
		default:
			n *= d
		}
	}
	if zero {
		return 0, nil
	}
	return n, nil
}

type tensorError struct {
	tensor string
	err    error
}

// sortAndCheckOverlap orders tensors by offset and reports the first tensor
// whose bytes begin before the previous tensor's end. Empty tensors occupy
// no bytes and may sit anywhere.
func sortAndCheckOverlap(ts []TensorInfo) *tensorError {
	slices.SortFunc(ts, func(a, b TensorInfo) int {
		return cmp.Or(cmp.Compare(a.Offset, b.Offset), cmp.Compare(a.Size, b.Size), cmp.Compare(a.Name, b.Name))
	})
	var prev *TensorInfo
	for i := range ts {
		t := &ts[i]
		if t.Size == 0 {
			continue
		}
		if prev != nil && t.Offset < prev.Offset+prev.Size {
			return &tensorError{t.Name, fmt.Errorf("%w: bytes [%d, %d) overlap tensor %q at [%d, %d)",
				ErrOverlap, t.Offset, t.Offset+t.Size, prev.Name, prev.Offset, prev.Offset+prev.Size)}
		}
		prev = t
	}
	return nil
}
