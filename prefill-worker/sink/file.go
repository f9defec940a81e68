package sink

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/tandem-inference/tandem/model"
)

// File is a LayerSink that writes a sequence's state to one file in the
// model's stable SeqState encoding (model/state.go), byte for byte what
// SeqState.MarshalBinary gives, without holding the state in memory: layer
// records go to a body file as they arrive, and Close writes the header
// (which needs the token and layer counts), the body and the checksum into
// the final file and renames it into place.
type File struct {
	path   string
	layers int

	mu     sync.Mutex
	body   *os.File
	w      *bufio.Writer
	held   int
	last   int
	done   bool
	failed error
}

// The encoding's constants (model/state.go).
const (
	stateMagic   = "K3ST"
	stateVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewFile starts a state file at path for a model of layers layers. The
// file appears only when Close succeeds.
func NewFile(path string, layers int) (*File, error) {
	body, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".body*")
	if err != nil {
		return nil, fmt.Errorf("file sink: %w", err)
	}
	return &File{path: path, layers: layers, body: body, w: bufio.NewWriterSize(body, 1<<20), last: -1}, nil
}

// Path is where the state file goes.
func (f *File) Path() string { return f.path }

func (f *File) PutLayer(ctx context.Context, ls *model.LayerState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed != nil || f.done {
		return fmt.Errorf("file sink %s: layer %d after the sink was closed or failed", f.path, ls.Layer)
	}
	if ls.Layer <= f.last || ls.Layer >= f.layers {
		return fmt.Errorf("file sink %s: layer %d after layer %d (want increasing layers below %d)", f.path, ls.Layer, f.last, f.layers)
	}
	if err := writeLayer(f.w, ls); err != nil {
		f.fail(err)
		return fmt.Errorf("file sink %s: layer %d: %w", f.path, ls.Layer, err)
	}
	f.last = ls.Layer
	f.held++
	return nil
}

// writeLayer writes one layer record:
// u32 layer | u8 kind | u32 nparts, then per part
// u8 kind | u8 dtype | u8 rank | rank x u64 dims | u64 nbytes | bytes.
func writeLayer(w *bufio.Writer, ls *model.LayerState) error {
	var b [8]byte
	le := binary.LittleEndian
	le.PutUint32(b[:], uint32(ls.Layer))
	w.Write(b[:4])
	w.WriteByte(byte(ls.Kind))
	le.PutUint32(b[:], uint32(len(ls.Parts)))
	w.Write(b[:4])
	for i := range ls.Parts {
		p := &ls.Parts[i]
		if p.Elems()*p.DType.Size() != len(p.Data) {
			return fmt.Errorf("part %s: shape %v of %s is %d bytes, data has %d", p.Kind, p.Shape, p.DType, p.Elems()*p.DType.Size(), len(p.Data))
		}
		w.WriteByte(byte(p.Kind))
		w.WriteByte(byte(p.DType))
		w.WriteByte(byte(len(p.Shape)))
		for _, d := range p.Shape {
			le.PutUint64(b[:], uint64(d))
			w.Write(b[:])
		}
		le.PutUint64(b[:], uint64(len(p.Data)))
		w.Write(b[:])
		if _, err := w.Write(p.Data); err != nil {
			return err
		}
	}
	return nil
}

// Close writes the state file for a sequence of tokens tokens.
func (f *File) Close(ctx context.Context, tokens int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed != nil {
		return fmt.Errorf("file sink %s: %w", f.path, f.failed)
	}
	if f.done {
		return nil
	}
	f.done = true
	err := f.finish(tokens)
	f.cleanup()
	if err != nil {
		return fmt.Errorf("file sink %s: %w", f.path, err)
	}
	return nil
}

func (f *File) finish(tokens int) (err error) {
	if err := f.w.Flush(); err != nil {
		return err
	}
	if _, err := f.body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	out, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	crc := crc32.New(castagnoli)
	w := bufio.NewWriterSize(io.MultiWriter(out, crc), 1<<20)
	var h []byte
	h = append(h, stateMagic...)
	h = binary.LittleEndian.AppendUint16(h, stateVersion)
	h = binary.LittleEndian.AppendUint32(h, uint32(f.layers))
	h = binary.LittleEndian.AppendUint64(h, uint64(tokens))
	h = binary.LittleEndian.AppendUint32(h, uint32(f.held))
	w.Write(h)
	if _, err := io.Copy(w, f.body); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := out.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32())); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(out.Name(), f.path)
}

func (f *File) fail(err error) {
	if f.failed == nil {
		f.failed = err
	}
}

func (f *File) cleanup() {
	if f.body != nil {
		f.body.Close()
		os.Remove(f.body.Name())
		f.body = nil
	}
}

// Abort removes the partial state.
func (f *File) Abort(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail(err)
	f.cleanup()
}

// ReadFile decodes a state file written by File (or by MarshalBinary).
func ReadFile(path string) (*model.SeqState, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := &model.SeqState{}
	if err := s.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
