package safetensors

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Checkpoint is an open set of safetensors shards. Lookups are safe for
// concurrent use; Close invalidates every view returned by Bytes.
type Checkpoint struct {
	Dir string

	shards  []*shard // in file name order
	tensors map[string]entry
	names   []string // sorted
	total   int64

	copyViews bool // Bytes reads copies instead of mapping (no mmap here, or a test)
	closed    atomic.Bool
	mu        sync.Mutex // guards shard mappings
}

type entry struct {
	info  TensorInfo
	shard *shard
}

type shard struct {
	idx    int // position in Checkpoint.shards
	path   string
	f      *os.File
	size   int64
	header *Header
	mapped []byte // whole file, once Bytes needed it
	stub   bool   // header only (StubsFile): its data are not here
}

// Open opens the checkpoint in dir. With model.safetensors.index.json it
// opens the shards the index names and cross-checks the index against their
// headers: a name mapped to a shard that lacks it, a tensor held by two
// shards or by a shard the index does not map it to, and an entry naming a
// missing file are errors. Without an index it opens every *.safetensors
// file in dir, and a tensor held by two of them is an error.
func Open(dir string) (*Checkpoint, error) {
	idxPath := filepath.Join(dir, IndexName)
	idx, err := ReadIndex(idxPath)
	switch {
	case err == nil:
		return openIndexed(dir, idxPath, idx)
	case errors.Is(err, fs.ErrNotExist):
		return openScan(dir)
	}
	return nil, err
}

func openScan(dir string) (*Checkpoint, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, de := range des {
		if strings.HasSuffix(de.Name(), ".safetensors") && !de.IsDir() {
			files = append(files, de.Name())
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("safetensors: %s has neither %s nor *.safetensors files: %w", dir, IndexName, fs.ErrNotExist)
	}
	c, err := openShards(dir, files)
	if err != nil {
		return nil, err
	}
	for _, s := range c.shards {
		for _, t := range s.header.Tensors {
			if prev, dup := c.tensors[t.Name]; dup {
				c.Close()
				return nil, &Error{File: s.path, Tensor: t.Name, Err: fmt.Errorf("%w: also in %s", ErrDuplicate, prev.info.File)}
			}
			c.add(s, t)
		}
	}
	return c.finish()
}

func openIndexed(dir, idxPath string, idx *Index) (*Checkpoint, error) {
	// The first name mapped to each file, for errors about the file.
	firstName := make(map[string]string)
	for name, file := range idx.WeightMap {
		if !isPlainFileName(file) {
			return nil, &Error{File: idxPath, Tensor: name, Err: fmt.Errorf("%w: shard %q is not a file name inside the checkpoint directory", ErrIndex, file)}
		}
		if prev, ok := firstName[file]; !ok || name < prev {
			firstName[file] = name
		}
	}
	if len(firstName) == 0 {
		return nil, &Error{File: idxPath, Err: fmt.Errorf("%w: the weight_map is empty", ErrIndex)}
	}
	files := make([]string, 0, len(firstName))
	for f := range firstName {
		files = append(files, f)
	}
	slices.Sort(files)
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, &Error{File: idxPath, Tensor: firstName[f], Err: fmt.Errorf("%w: the index maps it to %s: %w", ErrIndex, f, err)}
		}
	}
	c, err := openShards(dir, files)
	if err != nil {
		return nil, err
	}
	fail := func(file, tensor string, err error) (*Checkpoint, error) {
		c.Close()
		return nil, &Error{File: file, Tensor: tensor, Err: err}
	}
	for _, s := range c.shards {
		base := filepath.Base(s.path)
		for _, t := range s.header.Tensors {
			if prev, dup := c.tensors[t.Name]; dup {
				return fail(s.path, t.Name, fmt.Errorf("%w: also in %s", ErrDuplicate, prev.info.File))
			}
			switch want, ok := idx.WeightMap[t.Name]; {
			case !ok:
				return fail(s.path, t.Name, fmt.Errorf("%w: the shard holds it but %s does not list it", ErrIndex, IndexName))
			case want != base:
				return fail(s.path, t.Name, fmt.Errorf("%w: the shard holds it but %s maps it to %s", ErrIndex, IndexName, want))
			}
			c.add(s, t)
		}
	}
	// Every tensor found is in the index, so a shortfall is an index entry
	// whose shard lacks it.
	if len(c.tensors) != len(idx.WeightMap) {
		name := c.firstMissing(idx)
		return fail(filepath.Join(dir, idx.WeightMap[name]), name, fmt.Errorf("%w: %s maps it to this shard, whose header lacks it", ErrMissing, IndexName))
	}
	return c.finish()
}

// firstMissing returns the smallest index name no shard holds.
func (c *Checkpoint) firstMissing(idx *Index) string {
	var first string
	for name := range idx.WeightMap {
		if _, ok := c.tensors[name]; !ok && (first == "" || name < first) {
			first = name
		}
	}
	return first
}

// isPlainFileName refuses index entries that would reach outside the
// checkpoint directory.
func isPlainFileName(f string) bool {
	return f != "" && f != "." && f != ".." && !strings.ContainsAny(f, `/\`) && filepath.Base(f) == f
}

// openShards opens and parses every shard; on error it closes what it
// opened.
func openShards(dir string, files []string) (*Checkpoint, error) {
	c := &Checkpoint{Dir: dir, tensors: make(map[string]entry), copyViews: !canMap}
	for i, name := range files {
		s, err := openShard(filepath.Join(dir, name))
		if err != nil {
			c.Close()
			return nil, err
		}
		s.idx = i
		c.shards = append(c.shards, s)
	}
	return c, nil
}

func openShard(path string) (*shard, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = &Error{File: path, Err: fmt.Errorf("%w: not a regular file", ErrSyntax)}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	h, err := ParseHeader(f, st.Size(), path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &shard{path: path, f: f, size: st.Size(), header: h}, nil
}

func (c *Checkpoint) add(s *shard, t TensorInfo) {
	c.tensors[t.Name] = entry{info: t, shard: s}
	c.total += t.Size
}

// finish sorts the names and marks the stubs; on error it closes c.
func (c *Checkpoint) finish() (*Checkpoint, error) {
	c.names = make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		c.names = append(c.names, n)
	}
	slices.Sort(c.names)
	if err := c.markStubs(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Tensor returns a tensor's location.
func (c *Checkpoint) Tensor(name string) (TensorInfo, bool) {
	e, ok := c.tensors[name]
	if !ok {
		return TensorInfo{}, false
	}
	t := e.info
	t.Shape = slices.Clone(t.Shape)
	return t, true
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Files returns the shard paths in name order.
func (c *Checkpoint) Files() []string {
	out := make([]string, len(c.shards))
	for i, s := range c.shards {
		out[i] = s.path
	}
	return out
}

// Header returns the parsed header of the shard at path (as Files gives it).
func (c *Checkpoint) Header(path string) (*Header, bool) {
	for _, s := range c.shards {
		if s.path == path {
			return s.header, true
		}
	}
	return nil, false
}

// TotalSize returns the bytes of tensor data in all shards, the figure an
// index records as metadata.total_size.
func (c *Checkpoint) TotalSize() int64 { return c.total }

func (c *Checkpoint) lookup(name string) (entry, error) {
	if c.closed.Load() {
		return entry{}, &Error{File: c.Dir, Tensor: name, Err: ErrClosed}
	}
	e, ok := c.tensors[name]
	if !ok {
		return entry{}, &Error{File: c.Dir, Tensor: name, Err: fmt.Errorf("%w: no shard holds it", ErrMissing)}
	}
	return e, nil
}

// Bytes returns a tensor's bytes. Where the platform can map files it is a
// zero-copy view of the mapped shard: read-only (writing to it faults) and
// valid until Close. Elsewhere the bytes are read into a new slice.
func (c *Checkpoint) Bytes(name string) ([]byte, error) {
	e, err := c.data(name)
	if err != nil {
		return nil, err
	}
	if c.copyViews {
		b := make([]byte, e.info.Size)
		return b, c.readAt(e, b)
	}
	m, err := c.mapping(e.shard)
	if err != nil {
		return nil, &Error{File: e.shard.path, Tensor: name, Err: err}
	}
	end := e.info.Offset + e.info.Size
	return m[e.info.Offset:end:end], nil
}

func (c *Checkpoint) mapping(s *shard) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if s.mapped == nil {
		m, err := mapFile(s.f, s.size)
		if err != nil {
			return nil, err
		}
		s.mapped = m
	}
	return s.mapped, nil
}

// touched keeps Pin's reads of pages it could not lock (atomic: ranks
// may load at the same time).
var touched atomic.Uint32

// Pin keeps b, bytes Bytes returned, in memory: the pages of a mapped
// shard are faulted in now and locked, so that neither a first request nor
// the kernel's reclaim of idle file pages leaves them to be read from disk
// while a request waits (a decode rank touches most expert weights only
// now and then). Bytes read into the heap are in memory already. When the
// system refuses the lock (RLIMIT_MEMLOCK, wired-memory limits) the pages
// are still faulted in, and the error says why they may leave again.
func (c *Checkpoint) Pin(b []byte) error {
	if c.copyViews || len(b) == 0 {
		return nil
	}
	if err := lockPages(b); err != nil {
		const page = 4096
		var sum byte
		for i := 0; i < len(b); i += page {
			sum ^= b[i]
		}
		touched.Store(uint32(sum)) // kept, so that the reads are not optimized away
		return err
	}
	return nil
}

// ReadTensor reads a tensor's bytes into dst, which must be exactly its
// size, with a positioned read that leaves no state behind: it is safe to
// call concurrently.
func (c *Checkpoint) ReadTensor(name string, dst []byte) error {
	e, err := c.data(name)
	if err != nil {
		return err
	}
	if int64(len(dst)) != e.info.Size {
		return &Error{File: e.shard.path, Tensor: name, Err: fmt.Errorf("the destination holds %d bytes, the tensor %d", len(dst), e.info.Size)}
	}
	return c.readAt(e, dst)
}

func (c *Checkpoint) readAt(e entry, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	if _, err := e.shard.f.ReadAt(dst, e.info.Offset); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("the file ends before byte %d: %w", e.info.Offset+e.info.Size, io.ErrUnexpectedEOF)
		}
		return &Error{File: e.shard.path, Tensor: e.info.Name, Err: err}
	}
	return nil
}

// Close unmaps and closes every shard. Views from Bytes must not be used
// afterwards.
func (c *Checkpoint) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, s := range c.shards {
		if s.mapped != nil {
			errs = append(errs, unmapFile(s.mapped))
			s.mapped = nil
		}
		errs = append(errs, s.f.Close())
	}
	return errors.Join(errs...)
}
