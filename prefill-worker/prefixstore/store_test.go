package prefixstore

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/model"
)

func tinyConfig(t *testing.T) *model.Config {
	t.Helper()
	b, err := configs.ModelPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func toks(n, seed int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((seed*7919 + i*104729 + 13) % 256)
	}
	return out
}

// state is a state of n tokens with every value set from seed.
func state(c *model.Config, n int, seed uint64) *model.SeqState {
	st := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.BF16})
	r := rand.New(rand.NewPCG(seed, 1))
	for _, ls := range st.Layers {
		for i := range ls.Parts {
			p := &ls.Parts[i]
			if p.Kind == model.PartLatent {
				p.Shape[0] = n
				p.Data = make([]byte, n*p.Shape[1]*2)
				u := p.U16()
				for j := range u {
					u[j] = uint16(0x3f00 | r.IntN(0x7f)) // finite bf16 values
				}
				continue
			}
			f := p.F32()
			for j := range f {
				f[j] = r.Float32()
			}
		}
	}
	st.Tokens = n
	return st
}

func open(t *testing.T, dir string, c *model.Config, max int64, salt prefixkey.Hash) *Store {
	t.Helper()
	s, problems, err := Open(Config{Dir: dir, MaxBytes: max, Model: c, Salt: salt})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Logf("open: %v", p)
	}
	return s
}

func write(t *testing.T, s *Store, tokens []int32, st *model.SeqState, from string) {
	t.Helper()
	w, err := s.Create(tokens, from)
	if err != nil {
		t.Fatal(err)
	}
	for _, ls := range st.Layers {
		if err := w.Put(ls); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
}

func sameState(t *testing.T, got, want *model.SeqState) {
	t.Helper()
	if got.Tokens != want.Tokens {
		t.Fatalf("state of %d tokens, want %d", got.Tokens, want.Tokens)
	}
	for L := range want.Layers {
		for i := range want.Layers[L].Parts {
			if !bytes.Equal(got.Layers[L].Parts[i].Data, want.Layers[L].Parts[i].Data) {
				t.Fatalf("layer %d part %s differs", L, want.Layers[L].Parts[i].Kind)
			}
		}
	}
}

// TestStoreRoundTrip: an entry written layer by layer is found by a prompt
// that starts with its tokens (the longest one within the limit), read
// back bit for bit, survives a reopen, and is superseded by the entry of a
// prompt that resumed from it.
func TestStoreRoundTrip(t *testing.T) {
	c := tinyConfig(t)
	dir := t.TempDir()
	salt := prefixkey.Salt("m", uint8(model.BF16))
	s := open(t, dir, c, 1<<30, salt)
	prompt := toks(300, 1)
	st := state(c, 128, 1)
	write(t, s, prompt[:128], st, "")

	h, err := s.Lookup(prompt, 299, 400)
	if err != nil || h == nil {
		t.Fatalf("lookup: %v, %v", h, err)
	}
	if h.Tokens != 128 {
		t.Fatalf("hit of %d tokens, want 128", h.Tokens)
	}
	sameState(t, h.State, st)
	if p := h.State.Layers[0].Part(model.PartLatent); p != nil && cap(p.Data) < 400*p.Shape[1]*2 {
		t.Fatalf("MLA buffer has room for %d bytes, want 400 rows", cap(p.Data))
	}
	if h, _ := s.Lookup(prompt, 127, 0); h != nil {
		t.Fatalf("a hit of %d tokens past the limit of 127", h.Tokens)
	}
	if h, _ := s.Lookup(toks(300, 2), 299, 0); h != nil {
		t.Fatal("another prompt hit")
	}

	s2 := open(t, dir, c, 1<<30, salt)
	if h, err := s2.Lookup(prompt, 299, 0); err != nil || h == nil || h.Tokens != 128 {
		t.Fatalf("after reopening: %v, %v", h, err)
	}
	// The next turn resumes from it and supersedes it.
	st2 := state(c, 256, 2)
	write(t, s2, prompt[:256], st2, h.Key)
	if l := s2.List(); len(l) != 1 || l[0].Tokens != 256 {
		t.Fatalf("entries %+v, want the 256-token one alone", l)
	}
	if got := s2.Stats(); got.Inserts != 1 || got.Hits != 1 || got.Entries != 1 {
		t.Fatalf("stats %+v", got)
	}
}

// TestStoreEviction: the files stay within the size bound, the least
// recently used going first, and the order survives a reopen.
func TestStoreEviction(t *testing.T) {
	c := tinyConfig(t)
	dir := t.TempDir()
	salt := prefixkey.Salt("m", uint8(model.BF16))
	big := open(t, t.TempDir(), c, 1<<30, salt)
	write(t, big, toks(64, 9), state(c, 64, 9), "")
	one := big.Stats().Bytes // an entry of 64 tokens

	s := open(t, dir, c, 3*one, salt)
	for i := 1; i <= 3; i++ {
		write(t, s, toks(64, i), state(c, 64, uint64(i)), "")
	}
	if h, err := s.Lookup(toks(100, 1), 99, 0); h == nil || err != nil { // entry 1 is now the most recent
		t.Fatalf("lookup 1: %v %v", h, err)
	}
	write(t, s, toks(64, 4), state(c, 64, 4), "")
	if st := s.Stats(); st.Entries != 3 || st.Bytes > 3*one || st.Evictions != 1 {
		t.Fatalf("after the 4th entry: %+v (bound %d)", st, 3*one)
	}
	if h, _ := s.Lookup(toks(100, 2), 99, 0); h != nil {
		t.Fatal("entry 2, the least recently used, is still there")
	}
	for _, seed := range []int{1, 3, 4} {
		if h, _ := s.Lookup(toks(100, seed), 99, 0); h == nil {
			t.Fatalf("entry %d was evicted", seed)
		}
	}
	// Reopened with a smaller bound, the store keeps the most recent use.
	if h, _ := s.Lookup(toks(100, 3), 99, 0); h == nil {
		t.Fatal("entry 3 missing")
	}
	s2 := open(t, dir, c, one, salt)
	if l := s2.List(); len(l) != 1 {
		t.Fatalf("reopened within one entry's bytes: %d entries", len(l))
	}
	if h, _ := s2.Lookup(toks(100, 3), 99, 0); h == nil {
		t.Fatal("reopened: the most recently used entry (3) went")
	}
	// An entry larger than the whole bound is not kept.
	w, _ := s2.Create(toks(128, 5), "")
	for _, ls := range state(c, 128, 5).Layers {
		_ = w.Put(ls)
	}
	if err := w.Commit(); err == nil {
		t.Fatal("an entry larger than the store was kept")
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, tmpPref+"*")); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
}

// TestStoreCorrupt: a file whose bytes were changed, cut short, replaced by
// a hostile header, or left half-written by a crash is an error (or
// nothing), never a panic or a state: the entry goes and the prompt misses.
func TestStoreCorrupt(t *testing.T) {
	c := tinyConfig(t)
	salt := prefixkey.Salt("m", uint8(model.BF16))
	prompt := toks(200, 1)
	for _, tc := range []struct {
		name   string
		harm   func(b []byte) []byte
		atOpen bool // the header fails: reported by Open
	}{
		{"flipped byte in a layer", func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }, false},
		{"cut short", func(b []byte) []byte { return b[:len(b)-100] }, false},
		{"flipped token", func(b []byte) []byte { b[24] ^= 1; return b }, true},
		{"hostile token count", func(b []byte) []byte { b[19], b[20], b[21], b[22] = 0, 0, 0, 0x40; return b }, true},
		{"not a store file", func(b []byte) []byte { return []byte("hello") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, c, 1<<30, salt)
			write(t, s, prompt[:128], state(c, 128, 1), "")
			files, _ := filepath.Glob(filepath.Join(dir, "*"+suffix))
			if len(files) != 1 {
				t.Fatalf("files %v", files)
			}
			b, _ := os.ReadFile(files[0])
			if err := os.WriteFile(files[0], tc.harm(b), 0o600); err != nil {
				t.Fatal(err)
			}
			// Without reopening: the read checks everything.
			h, err := s.Lookup(prompt, 199, 0)
			if h != nil || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("lookup of a harmed file: %v, %v; want ErrCorrupt", h, err)
			}
			if _, err := os.Stat(files[0]); !os.IsNotExist(err) {
				t.Fatal("the harmed file is still there")
			}
			if h, err := s.Lookup(prompt, 199, 0); h != nil || err != nil {
				t.Fatalf("second lookup: %v, %v", h, err)
			}
			// Reopening a store with the harmed file in it.
			write(t, s, prompt[:128], state(c, 128, 1), "")
			b, _ = os.ReadFile(files[0])
			_ = os.WriteFile(files[0], tc.harm(b), 0o600)
			s2, problems, err := Open(Config{Dir: dir, MaxBytes: 1 << 30, Model: c, Salt: salt})
			if err != nil {
				t.Fatal(err)
			}
			if tc.atOpen != (len(problems) == 1) {
				t.Fatalf("problems at open: %v", problems)
			}
			if h, _ := s2.Lookup(prompt, 199, 0); h != nil {
				t.Fatal("a harmed entry was read as a hit")
			}
		})
	}
	// A write cut short by a crash leaves a temporary file, removed at
	// open, and no entry.
	dir := t.TempDir()
	s := open(t, dir, c, 1<<30, salt)
	w, _ := s.Create(prompt[:128], "")
	_ = w.Put(state(c, 128, 1).Layers[0])
	_ = w.w.Flush()
	s2 := open(t, dir, c, 1<<30, salt)
	if n := len(s2.List()); n != 0 {
		t.Fatalf("%d entries after a crash mid-write", n)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, tmpPref+"*")); len(tmp) != 0 {
		t.Fatalf("temporary files left after open: %v", tmp)
	}
	// A layer of the wrong length is refused while writing.
	w, _ = s2.Create(prompt[:128], "")
	var perr error
	for _, ls := range state(c, 64, 1).Layers {
		if perr = w.Put(ls); perr != nil {
			break
		}
	}
	if perr == nil || !strings.Contains(perr.Error(), "expected") {
		t.Fatalf("MLA rows of 64 tokens for an entry of 128: %v", perr)
	}
	w.Abort()
}

// TestStoreInvalidation: entries written for another model identity or
// another cache dtype are removed when the store opens, and never hit.
func TestStoreInvalidation(t *testing.T) {
	c := tinyConfig(t)
	dir := t.TempDir()
	prompt := toks(200, 1)
	s := open(t, dir, c, 1<<30, prefixkey.Salt("model-a", uint8(model.BF16)))
	write(t, s, prompt[:128], state(c, 128, 1), "")
	for _, salt := range []prefixkey.Hash{prefixkey.Salt("model-b", uint8(model.BF16)), prefixkey.Salt("model-a", uint8(model.F32))} {
		s2 := open(t, dir, c, 1<<30, salt)
		if h, _ := s2.Lookup(prompt, 199, 0); h != nil {
			t.Fatal("an entry of another model or dtype hit")
		}
		if st := s2.Stats(); st.Invalidated != 1 || st.Entries != 0 {
			t.Fatalf("stats %+v: want the entry invalidated", st)
		}
		write(t, s, prompt[:128], state(c, 128, 1), "") // again for the next case
	}
	// Under the same identity it stays.
	s3 := open(t, dir, c, 1<<30, prefixkey.Salt("model-a", uint8(model.BF16)))
	if h, err := s3.Lookup(prompt, 199, 0); h == nil || err != nil {
		t.Fatalf("same model: %v %v", h, err)
	}
}

// TestStoreCollision: under a chain that maps every prompt to one link, a
// lookup compares the tokens: another prompt's entry is a miss, not a hit.
func TestStoreCollision(t *testing.T) {
	c := tinyConfig(t)
	s, _, err := Open(Config{Dir: t.TempDir(), MaxBytes: 1 << 30, Model: c, Salt: 1,
		Hash: func(prev prefixkey.Hash, _ []int32) prefixkey.Hash { return prev + 1 }})
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, toks(64, 1), state(c, 64, 1), "")
	if h, err := s.Lookup(toks(100, 2), 99, 0); h != nil || err != nil {
		t.Fatalf("a colliding prompt: %v, %v", h, err)
	}
	if h, _ := s.Lookup(toks(100, 1), 99, 0); h == nil {
		t.Fatal("the entry's own prompt missed")
	}
}

// TestStoreListing: a listing (what an operator sees) gives each entry its
// key, tokens, bytes, the chain link at its length and when it was kept or
// last resumed from; that time is the file's modification time, so it
// survives a reopen. A drop by key removes that entry only.
func TestStoreListing(t *testing.T) {
	c := tinyConfig(t)
	dir := t.TempDir()
	salt := prefixkey.Salt("m", uint8(model.BF16))
	s := open(t, dir, c, 1<<30, salt)
	a, b := toks(128, 1), toks(64, 2)
	before := time.Now().Add(-time.Second)
	write(t, s, a, state(c, 128, 1), "")
	write(t, s, b, state(c, 64, 2), "")
	l := s.List()
	if len(l) != 2 || l[0].Tokens != 64 || l[1].Tokens != 128 {
		t.Fatalf("list %+v, want the 64-token entry (the newer) first", l)
	}
	for _, e := range l {
		tokens := map[int][]int32{64: b, 128: a}[e.Tokens]
		chain := prefixkey.Chain(prefixkey.SHA256, salt, tokens)
		if e.Link != chain[len(chain)-1] || e.Bytes <= 0 || e.LastUse.Before(before) || !strings.HasSuffix(e.Key, "-"+strconv.Itoa(e.Tokens)) {
			t.Fatalf("entry %+v: want link %x, bytes and a last use after %v", e, chain[len(chain)-1], before)
		}
	}
	// Resumed from at a known time (the file's time, as a lookup sets it),
	// then reopened: the time is the file's.
	then := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dir, l[1].Key+suffix), then, then); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, c, 1<<30, salt)
	l = s.List()
	if len(l) != 2 || l[1].Tokens != 128 || !l[1].LastUse.Equal(then) {
		t.Fatalf("after a reopen: %+v, want the 128-token entry last used at %v", l, then)
	}
	if n := s.Drop(l[1].Key); n != 1 {
		t.Fatalf("drop of %s: %d entries", l[1].Key, n)
	}
	if n := s.Drop(l[1].Key); n != 0 {
		t.Fatalf("a second drop of %s: %d entries", l[1].Key, n)
	}
	if l2 := s.List(); len(l2) != 1 || l2[0].Key != l[0].Key {
		t.Fatalf("after the drop: %+v", l2)
	}
	if h, err := s.Lookup(a, len(a), len(a)); err != nil || h != nil {
		t.Fatalf("a dropped entry was found: %+v %v", h, err)
	}
}
