package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// StubsFile names, in a checkpoint directory, the shards that are
// header-only stubs: the real shard's header followed by a hole up to its
// real size. `bench checkpoint shards --copy`, package model/layout, writes
// it for the part of a checkpoint one process needs, since every process
// opens every shard's header but reads only its own tensors' data. A
// tensor in a stub is refused with ErrStub where its data are needed,
// instead of computing with zero weights. A sparse synthetic checkpoint,
// `bench mkmodel --sparse`, has no such file: its every weight is a hole on
// purpose, for planning and streaming at full size, and reads as zeros.
const StubsFile = "tandem-shards.json"

// ErrStub: the tensor's shard is a header-only stub (StubsFile).
var ErrStub = errors.New("its shard is a header-only stub: this directory holds only the header of that shard (" + StubsFile +
	", written by `bench checkpoint shards --copy` for another part of the model), and this process needs the tensor's data;" +
	" copy the shards it needs (`bench checkpoint shards --copy` with its --rank/--ranks or --layers) or give it the full checkpoint")

// maxStubsFile bounds what is read of StubsFile: a name per shard.
const maxStubsFile = 1 << 20

// readStubs reads dir's StubsFile: the stubs' file names (nil when there
// is none).
func readStubs(dir string) (map[string]bool, error) {
	path := filepath.Join(dir, StubsFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStubsFile+1))
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	if len(b) > maxStubsFile {
		return nil, &Error{File: path, Err: fmt.Errorf("%w: longer than %d bytes", ErrSyntax, maxStubsFile)}
	}
	var rec struct {
		Stubs []string `json:"stubs"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, &Error{File: path, Err: fmt.Errorf("%w: %v", ErrSyntax, err)}
	}
	stubs := make(map[string]bool, len(rec.Stubs))
	for _, s := range rec.Stubs {
		if !isPlainFileName(s) {
			return nil, &Error{File: path, Err: fmt.Errorf("%w: stub %q is not a file name inside the checkpoint directory", ErrSyntax, s)}
		}
		stubs[s] = true
	}
	return stubs, nil
}

// markStubs marks the shards StubsFile names; a name that is not one of
// the checkpoint's shards is an error.
func (c *Checkpoint) markStubs() error {
	stubs, err := readStubs(c.Dir)
	if err != nil || len(stubs) == 0 {
		return err
	}
	for _, s := range c.shards {
		if stubs[filepath.Base(s.path)] {
			s.stub = true
			delete(stubs, filepath.Base(s.path))
		}
	}
	for name := range stubs {
		return &Error{File: filepath.Join(c.Dir, StubsFile), Err: fmt.Errorf("%w: stub %q is not a shard of the checkpoint", ErrIndex, name)}
	}
	return nil
}

// NeedData refuses, with ErrStub naming the shard and the tensor, the
// first named tensor whose shard is a stub (see StubsFile): for readers
// that read the shards' files themselves (a weight streamer); Bytes,
// ReadTensor and Runs check it already. An unknown name is ErrMissing.
func (c *Checkpoint) NeedData(names ...string) error {
	for _, n := range names {
		if _, err := c.data(n); err != nil {
			return err
		}
	}
	return nil
}

// Stubs returns the paths of the shards that are stubs, in name order.
func (c *Checkpoint) Stubs() []string {
	var out []string
	for _, s := range c.shards {
		if s.stub {
			out = append(out, s.path)
		}
	}
	return out
}

// data looks a tensor up for reading its data: a tensor in a stub is
// refused.
func (c *Checkpoint) data(name string) (entry, error) {
	e, err := c.lookup(name)
	if err != nil {
		return e, err
	}
	if e.shard.stub {
		return entry{}, &Error{File: e.shard.path, Tensor: name, Err: ErrStub}
	}
	return e, nil
}
