// Package prefixstore is the prefill worker's own prefix-state store: the
// whole state (every layer's MLA rows and KDA state) of prompts it
// prefilled, kept in files on a local disk (NVMe) so that the next turn of a
// session, whose prompt starts with the same tokens, is prefilled from
// there: only the new tokens go through the weight pass.
//
// Entries are keyed as the decode ranks' cache keys theirs: the link of
// internal/prefixkey's hash chain at the entry's length, seeded by the
// model's identity and the cache dtype, and the tokens are compared on every
// hit (a hash only narrows the search). An entry's length is a multiple of
// the KDA chunk, where a resumed chunked prefill gives exactly the bits of a
// from-scratch one.
//
// The store is bounded: its files' bytes stay within a size limit, the
// least recently used entries going first (use is recorded in the files'
// modification times, so the order survives a restart). Writes are crash
// safe: an entry is written to a temporary file, synced, and renamed into
// place, and every file ends with a CRC-32C of its contents, checked on
// every read with the header and every layer's shape. A file that fails is
// an error (and is removed), never a panic or a state taken on trust.
package prefixstore

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/model"
)

// Block is the grid entries lie on: the KDA chunk.
const Block = prefixkey.Block

// File format (little-endian):
//
//	magic "K3PS" | u16 version | u64 salt | u8 latent dtype | u32 layers |
//	u32 tokens | tokens x i32 | u32 CRC-32C of the header so far |
//	layers x (model.AppendLayerState record) | u32 CRC-32C of the whole file before it
const (
	magic   = "K3PS"
	version = 1
	suffix  = ".k3ps"
	tmpPref = ".tmp-"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is wrapped by every error about a file's contents.
var ErrCorrupt = errors.New("prefix store: corrupt entry")

// Config sets up a store.
type Config struct {
	// Dir holds the entries (created if missing).
	Dir string
	// MaxBytes bounds the entries' files together.
	MaxBytes int64
	// Model and DType fix the state an entry must hold.
	Model *model.Config
	DType model.DType
	// Salt seeds the chain: prefixkey.Salt of the model's identity and the
	// dtype. Files written under another salt (another model, another
	// dtype) are removed when the store opens.
	Salt prefixkey.Hash
	// Hash chains the blocks (default prefixkey.SHA256; tests weaken it to
	// force collisions).
	Hash prefixkey.HashFunc
}

// Store is a bounded on-disk prefix store. It is safe for concurrent use.
type Store struct {
	cfg Config

	mu      sync.Mutex
	entries map[string]*entry // by file name
	index   map[prefixkey.Hash][]string
	bytes   int64
	clock   uint64
	stats   Stats
}

type entry struct {
	name  string
	link  prefixkey.Hash
	pos   int
	size  int64
	used  uint64
	mtime time.Time // when the entry was kept or last resumed from
}

// Stats counts what the store did; Entries and Bytes are current.
type Stats struct {
	Entries     int   `json:"entries"`
	Bytes       int64 `json:"bytes"`
	Lookups     int64 `json:"lookups"`
	Hits        int64 `json:"hits"`
	HitTokens   int64 `json:"hit_tokens"`
	Misses      int64 `json:"misses"`
	Evictions   int64 `json:"evictions"`
	Inserts     int64 `json:"inserts"`
	Corrupt     int64 `json:"corrupt"`     // files removed because they failed a check
	Invalidated int64 `json:"invalidated"` // files of another model or dtype removed
}

// Open opens (or creates) the store in cfg.Dir: it reads every entry's
// header to index it, removes leftover temporary files (a write a crash
// cut short), files of another model or cache dtype, and files whose
// header fails its checks (each reported in the returned problems, which do
// not stop the store from opening). Entries beyond the size bound go, the
// least recently used first.
func Open(cfg Config) (*Store, []error, error) {
	switch {
	case cfg.Dir == "":
		return nil, nil, errors.New("prefix store: no directory")
	case cfg.MaxBytes <= 0:
		return nil, nil, fmt.Errorf("prefix store %s: size limit %d bytes", cfg.Dir, cfg.MaxBytes)
	case cfg.Model == nil:
		return nil, nil, fmt.Errorf("prefix store %s: no model config", cfg.Dir)
	}
	if cfg.DType == 0 {
		cfg.DType = model.BF16
	}
	if cfg.Hash == nil {
		cfg.Hash = prefixkey.SHA256
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("prefix store: %w", err)
	}
	s := &Store{cfg: cfg, entries: map[string]*entry{}, index: map[prefixkey.Hash][]string{}}
	des, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("prefix store: %w", err)
	}
	var found []*entry
	var errs []error
	for _, de := range des {
		name := de.Name()
		path := filepath.Join(cfg.Dir, name)
		switch {
		case strings.HasPrefix(name, tmpPref):
			_ = os.Remove(path) // a write cut short
			continue
		case !strings.HasSuffix(name, suffix) || !de.Type().IsRegular():
			continue
		}
		e, err := s.readIndex(path)
		switch {
		case errors.Is(err, errOtherSalt):
			s.stats.Invalidated++
			_ = os.Remove(path)
		case err != nil:
			s.stats.Corrupt++
			errs = append(errs, err)
			_ = os.Remove(path)
		default:
			e.name = name
			found = append(found, e)
		}
	}
	// Least recently used first: the files' modification times.
	slices.SortFunc(found, func(a, b *entry) int { return a.mtime.Compare(b.mtime) })
	for _, e := range found {
		s.clock++
		e.used = s.clock
		s.add(e)
	}
	s.evictLocked("")
	return s, errs, nil
}

var errOtherSalt = errors.New("written for another model or cache dtype")

// readIndex reads a file's header: enough to index it.
func (s *Store) readIndex(path string) (*entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("prefix store: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("prefix store: %w", err)
	}
	h, err := s.readHeader(bufio.NewReader(f), fi.Size(), path)
	if err != nil {
		return nil, err
	}
	chain := prefixkey.Chain(s.cfg.Hash, s.cfg.Salt, h.tokens)
	return &entry{link: chain[len(chain)-1], pos: len(h.tokens), size: fi.Size(), mtime: fi.ModTime()}, nil
}

type header struct {
	tokens []int32
	crc    hash.Hash32 // over everything read so far
}

// readHeader reads and checks a file's header from r; size is the file's
// size, which bounds what the header may claim.
func (s *Store) readHeader(r io.Reader, size int64, path string) (*header, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, path, fmt.Sprintf(format, args...))
	}
	crc := crc32.New(castagnoli)
	tr := io.TeeReader(r, crc)
	var fixed [4 + 2 + 8 + 1 + 4 + 4]byte
	if _, err := io.ReadFull(tr, fixed[:]); err != nil {
		return nil, bad("header: %v", err)
	}
	if string(fixed[:4]) != magic {
		return nil, bad("not a prefix store file (magic %q)", fixed[:4])
	}
	if v := binary.LittleEndian.Uint16(fixed[4:]); v != version {
		return nil, bad("version %d, this worker reads %d", v, version)
	}
	salt := prefixkey.Hash(binary.LittleEndian.Uint64(fixed[6:]))
	dtype := model.DType(fixed[14])
	layers := int(binary.LittleEndian.Uint32(fixed[15:]))
	n := int64(binary.LittleEndian.Uint32(fixed[19:]))
	if salt != s.cfg.Salt || dtype != s.cfg.DType {
		return nil, fmt.Errorf("prefix store: %s: %w", path, errOtherSalt)
	}
	switch {
	case layers != s.cfg.Model.NumLayers:
		return nil, bad("%d layers, the model has %d", layers, s.cfg.Model.NumLayers)
	case n == 0 || n%Block != 0:
		return nil, bad("%d tokens: an entry holds a positive multiple of %d", n, Block)
	case int64(len(fixed))+4*n+4 > size:
		return nil, bad("%d tokens do not fit in its %d bytes", n, size)
	}
	buf := make([]byte, 4*n+4)
	if _, err := io.ReadFull(tr, buf[:4*n]); err != nil {
		return nil, bad("tokens: %v", err)
	}
	want := crc.Sum32()
	if _, err := io.ReadFull(r, buf[4*n:]); err != nil {
		return nil, bad("header checksum: %v", err)
	}
	crc.Write(buf[4*n:])
	if got := binary.LittleEndian.Uint32(buf[4*n:]); got != want {
		return nil, bad("header checksum mismatch")
	}
	h := &header{tokens: make([]int32, n), crc: crc}
	for i := range h.tokens {
		t := int32(binary.LittleEndian.Uint32(buf[4*i:]))
		// A negative word is an image row's key (prefixkey.Fold).
		if int(t) >= s.cfg.Model.VocabSize {
			return nil, bad("token %d is %d, outside the vocabulary", i, t)
		}
		h.tokens[i] = t
	}
	return h, nil
}

func (s *Store) add(e *entry) {
	s.entries[e.name] = e
	s.index[e.link] = append(s.index[e.link], e.name)
	s.bytes += e.size
}

func (s *Store) removeLocked(e *entry) {
	delete(s.entries, e.name)
	s.index[e.link] = slices.DeleteFunc(s.index[e.link], func(n string) bool { return n == e.name })
	if len(s.index[e.link]) == 0 {
		delete(s.index, e.link)
	}
	s.bytes -= e.size
	_ = os.Remove(filepath.Join(s.cfg.Dir, e.name))
}

// evictLocked removes the least recently used entries (never keep) until
// the store is within its bound.
func (s *Store) evictLocked(keep string) {
	for s.bytes > s.cfg.MaxBytes {
		var victim *entry
		for _, e := range s.entries {
			if e.name != keep && (victim == nil || e.used < victim.used || e.used == victim.used && e.name < victim.name) {
				victim = e
			}
		}
		if victim == nil {
			return
		}
		s.removeLocked(victim)
		s.stats.Evictions++
	}
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Entries, st.Bytes = len(s.entries), s.bytes
	return st
}

// Salt is the chain's seed.
func (s *Store) Salt() prefixkey.Hash { return s.cfg.Salt }

// Link is a prefix the store can resume from: its chain link and length.
type Link struct {
	Hash   prefixkey.Hash
	Tokens int
}

// Links lists the entries' links, the most recently used first, at most
// max: what the worker advertises so that a router can price a hit.
func (s *Store) Links(max int) []Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	es := s.sortedLocked()
	out := make([]Link, 0, min(max, len(es)))
	for _, e := range es {
		if len(out) == max {
			break
		}
		out = append(out, Link{Hash: e.link, Tokens: e.pos})
	}
	return out
}

func (s *Store) sortedLocked() []*entry {
	es := make([]*entry, 0, len(s.entries))
	for _, e := range s.entries {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b *entry) int {
		if a.used != b.used {
			return int(b.used) - int(a.used)
		}
		return strings.Compare(a.name, b.name)
	})
	return es
}

// Info describes an entry for listings.
type Info struct {
	Key    string `json:"key"` // the file's name without its suffix
	Tokens int    `json:"tokens"`
	Bytes  int64  `json:"bytes"`
	// Link is the prefix's chain link at Tokens.
	Link prefixkey.Hash `json:"link"`
	// LastUse is when the entry was kept or last resumed from (its
	// file's modification time, across restarts).
	LastUse time.Time `json:"last_use"`
}

// List describes the entries, the most recently used first.
func (s *Store) List() []Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Info
	for _, e := range s.sortedLocked() {
		out = append(out, Info{Key: strings.TrimSuffix(e.name, suffix), Tokens: e.pos, Bytes: e.size, Link: e.link, LastUse: e.mtime})
	}
	return out
}

// Drop removes the entry of the given key, or every entry when key is
// empty, and returns how many went.
func (s *Store) Drop(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.sortedLocked() {
		if key == "" || e.name == key+suffix {
			s.removeLocked(e)
			n++
		}
	}
	return n
}

// Hit is a stored prefix a prompt resumes from.
type Hit struct {
	// State holds every layer at Tokens tokens (its MLA buffers have room
	// for capacity tokens, as asked of Lookup).
	State  *model.SeqState
	Tokens int
	Key    string
}

// Lookup finds the longest stored prefix of tokens, at most limit tokens,
// and reads its state (room for capacity tokens in each MLA layer). It
// returns nil and no error when there is none. A file that fails its
// checks is removed and returned as an error wrapping ErrCorrupt (the
// caller prefills from scratch); a file whose tokens differ from the
// prompt's (a hash collision) is a miss.
func (s *Store) Lookup(tokens []int32, limit, capacity int) (*Hit, error) {
	limit = min(limit, len(tokens))
	chain := prefixkey.Chain(s.cfg.Hash, s.cfg.Salt, tokens[:limit/Block*Block])
	s.mu.Lock()
	s.stats.Lookups++
	s.mu.Unlock()
	var errs []error
	for i := len(chain) - 1; i >= 0; i-- {
		p := (i + 1) * Block
		s.mu.Lock()
		names := slices.Clone(s.index[chain[i]])
		s.mu.Unlock()
		for _, name := range names {
			st, err := s.read(name, tokens[:p], max(capacity, p))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if st == nil {
				continue // another prompt under the same link
			}
			now := time.Now()
			s.mu.Lock()
			if e := s.entries[name]; e != nil {
				s.clock++
				e.used, e.mtime = s.clock, now
			}
			s.stats.Hits++
			s.stats.HitTokens += int64(p)
			s.mu.Unlock()
			_ = os.Chtimes(filepath.Join(s.cfg.Dir, name), now, now) // the LRU order outlives the process
			return &Hit{State: st, Tokens: p, Key: strings.TrimSuffix(name, suffix)}, errors.Join(errs...)
		}
	}
	s.mu.Lock()
	s.stats.Misses++
	s.mu.Unlock()
	return nil, errors.Join(errs...)
}

// read reads entry name and checks it whole: the header, that its tokens
// are prefix (nil, nil otherwise), every layer's parts for len(prefix)
// tokens, and the checksum. A failed file is removed.
func (s *Store) read(name string, prefix []int32, capacity int) (st *model.SeqState, err error) {
	path := filepath.Join(s.cfg.Dir, name)
	defer func() {
		if err != nil {
			s.mu.Lock()
			if e := s.entries[name]; e != nil {
				s.removeLocked(e)
			} else {
				_ = os.Remove(path)
			}
			s.stats.Corrupt++
			s.mu.Unlock()
		}
	}()
	if fi, err := os.Stat(path); err != nil || fi.Size() > s.cfg.MaxBytes {
		if err == nil {
			err = fmt.Errorf("%d bytes, more than the store's %d", fi.Size(), s.cfg.MaxBytes)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, path, fmt.Sprintf(format, args...))
	}
	if len(b) < 4 {
		return nil, bad("%d bytes", len(b))
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, bad("checksum mismatch")
	}
	h, err := s.readHeader(bytes.NewReader(body), int64(len(b)), path)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(h.tokens, prefix) {
		return nil, nil
	}
	n := len(prefix)
	rest := body[4+2+8+1+4+4+4*n+4:]
	c := s.cfg.Model
	st = &model.SeqState{Tokens: n, Layers: make([]*model.LayerState, c.NumLayers)}
	for L := range c.NumLayers {
		ls, r, err := model.ReadLayerState(rest, c.NumLayers)
		if err != nil {
			return nil, bad("layer %d: %v", L, err)
		}
		rest = r
		if err := c.CheckLayerState(ls, L, n, s.cfg.DType); err != nil {
			return nil, bad("%v", err)
		}
		if p := ls.Part(model.PartLatent); p != nil && capacity > n {
			p.Data = append(make([]byte, 0, capacity*p.Shape[1]*p.DType.Size()), p.Data...)
		}
		st.Layers[L] = ls
	}
	if len(rest) != 0 {
		return nil, bad("%d bytes after the last layer", len(rest))
	}
	return st, nil
}

// Writer writes one entry layer by layer (a model.LayerSink's order:
// layers in order). Nothing is visible until Commit; Abort, or a crash,
// leaves no entry.
type Writer struct {
	s      *Store
	f      *os.File
	w      *bufio.Writer
	crc    hash.Hash32
	tokens []int32
	next   int
	size   int64
	from   string
	err    error
}

// Create starts an entry for the state of tokens (a positive multiple of
// Block). from is the key of the entry the prompt resumed from ("" if
// none): an entry whose whole prefix the new one holds is superseded by it
// at Commit, so that a session keeps one entry.
func (s *Store) Create(tokens []int32, from string) (*Writer, error) {
	n := len(tokens)
	if n == 0 || n%Block != 0 {
		return nil, fmt.Errorf("prefix store: an entry of %d tokens; entries hold a positive multiple of %d", n, Block)
	}
	f, err := os.CreateTemp(s.cfg.Dir, tmpPref+"*")
	if err != nil {
		return nil, fmt.Errorf("prefix store: %w", err)
	}
	w := &Writer{s: s, f: f, crc: crc32.New(castagnoli), tokens: slices.Clone(tokens), from: from}
	w.w = bufio.NewWriterSize(io.MultiWriter(f, w.crc), 1<<20)
	hdr := make([]byte, 0, 4+2+8+1+4+4+4*n)
	hdr = append(hdr, magic...)
	hdr = binary.LittleEndian.AppendUint16(hdr, version)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(s.cfg.Salt))
	hdr = append(hdr, byte(s.cfg.DType))
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(s.cfg.Model.NumLayers))
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(n))
	for _, t := range tokens {
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(t))
	}
	w.write(hdr)
	w.write(binary.LittleEndian.AppendUint32(nil, w.crcNow()))
	return w, w.err
}

func (w *Writer) crcNow() uint32 {
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.crc.Sum32()
}

func (w *Writer) write(b []byte) {
	if w.err != nil {
		return
	}
	_, w.err = w.w.Write(b)
	w.size += int64(len(b))
}

// Tokens is the length of the entry being written.
func (w *Writer) Tokens() int { return len(w.tokens) }

// Put writes the next layer's state, which must hold the entry's tokens.
func (w *Writer) Put(ls *model.LayerState) error {
	if w.err != nil {
		return w.err
	}
	c := w.s.cfg.Model
	if ls.Layer != w.next {
		w.err = fmt.Errorf("prefix store: layer %d written after %d layers", ls.Layer, w.next)
		return w.err
	}
	if err := c.CheckLayerState(ls, ls.Layer, len(w.tokens), w.s.cfg.DType); err != nil {
		w.err = fmt.Errorf("prefix store: %w", err)
		return w.err
	}
	b, err := model.AppendLayerState(nil, ls)
	if err != nil {
		w.err = err
		return err
	}
	w.write(b)
	w.next++
	return w.err
}

// Commit finishes the entry: the checksum, a sync, the rename into place,
// then the size bound (the least recently used entries go; an entry
// larger than the whole bound is not kept).
func (w *Writer) Commit() error {
	if w.err == nil && w.next != w.s.cfg.Model.NumLayers {
		w.err = fmt.Errorf("prefix store: committing %d of %d layers", w.next, w.s.cfg.Model.NumLayers)
	}
	w.write(binary.LittleEndian.AppendUint32(nil, w.crcNow()))
	if w.err == nil {
		w.err = w.w.Flush()
	}
	if w.err == nil {
		w.err = w.f.Sync()
	}
	if err := w.f.Close(); w.err == nil {
		w.err = err
	}
	if w.err != nil {
		_ = os.Remove(w.f.Name())
		return w.err
	}
	s := w.s
	chain := prefixkey.Chain(s.cfg.Hash, s.cfg.Salt, w.tokens)
	link := chain[len(chain)-1]
	name := fmt.Sprintf("%016x-%d%s", uint64(link), len(w.tokens), suffix)
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.size > s.cfg.MaxBytes {
		_ = os.Remove(w.f.Name())
		return fmt.Errorf("prefix store: an entry of %d bytes exceeds the store's %d", w.size, s.cfg.MaxBytes)
	}
	if err := os.Rename(w.f.Name(), filepath.Join(s.cfg.Dir, name)); err != nil {
		_ = os.Remove(w.f.Name())
		return fmt.Errorf("prefix store: %w", err)
	}
	syncDir(s.cfg.Dir)
	if old := s.entries[name]; old != nil {
		s.bytes -= old.size // replaced in place by the rename
		delete(s.entries, name)
		s.index[old.link] = slices.DeleteFunc(s.index[old.link], func(n string) bool { return n == name })
	}
	if old := s.entries[w.from+suffix]; w.from != "" && old != nil && old.pos < len(w.tokens) {
		s.removeLocked(old) // superseded: the new entry holds all of it
	}
	s.clock++
	s.add(&entry{name: name, link: link, pos: len(w.tokens), size: w.size, used: s.clock, mtime: time.Now()})
	s.stats.Inserts++
	s.evictLocked(name)
	return nil
}

// Abort gives the entry up.
func (w *Writer) Abort() {
	_ = w.f.Close()
	_ = os.Remove(w.f.Name())
	if w.err == nil {
		w.err = errors.New("prefix store: entry aborted")
	}
}

// syncDir makes a rename durable where the system allows it.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
