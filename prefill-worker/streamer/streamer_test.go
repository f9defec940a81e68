package streamer_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/layout"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

func open(t *testing.T, dir string, opt streamer.Options) (*safetensors.Checkpoint, *model.Config, *streamer.Streamer) {
	t.Helper()
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	lay, err := streamer.NewLayout(ck, cfg.NumLayers, streamer.DefaultAlign)
	if err != nil {
		t.Fatal(err)
	}
	s, err := streamer.New(lay, cpu.New(1), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return ck, cfg, s
}

// layerNames lists the checkpoint's tensors of each layer.
func layerNames(ck *safetensors.Checkpoint, layers int) [][]string {
	out := make([][]string, layers)
	for _, n := range ck.Names() {
		if L, ok := model.LayerOf(n); ok && L >= 0 {
			out[L] = append(out[L], n)
		}
	}
	return out
}

// TestStreamMatchesCheckpoint streams every layer at several depths, request
// sizes, reader counts and I/O modes, and checks every tensor's bytes and
// header facts against positioned reads of the checkpoint, and that the
// layer binds.
func TestStreamMatchesCheckpoint(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	for _, tc := range []struct {
		depth, readers int
		readSize       int64
		io             streamer.IOMode
	}{
		{0, 1, 4096, streamer.IOAuto},
		{1, 3, 8192, streamer.IOAuto},
		{2, 2, 1 << 20, streamer.IOAuto},
		{3, 4, 12288, streamer.IOBuffered},
	} {
		ck, cfg, s := open(t, dir, streamer.Options{Slots: tc.depth + 1, ReadSize: tc.readSize, Readers: tc.readers, IO: tc.io})
		if tc.io == streamer.IOAuto && runtime.GOOS == "linux" && !s.Direct() {
			t.Logf("direct I/O unavailable on %s; tested buffered", dir)
		}
		names := layerNames(ck, cfg.NumLayers)
		p, err := s.Start(context.Background(), tc.depth)
		if err != nil {
			t.Fatal(err)
		}
		for L := 0; L < cfg.NumLayers; L++ {
			sl, err := p.Next(context.Background())
			if err != nil {
				t.Fatalf("depth %d: layer %d: %v", tc.depth, L, err)
			}
			if sl.Layer() != L {
				t.Fatalf("got layer %d, want %d", sl.Layer(), L)
			}
			src := sl.Source()
			for _, n := range names[L] {
				info, _ := ck.Tensor(n)
				want := make([]byte, info.Size)
				if err := ck.ReadTensor(n, want); err != nil {
					t.Fatal(err)
				}
				got, err := src.Data(n)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("depth %d layer %d tensor %s: streamed bytes differ (err %v)", tc.depth, L, n, err)
				}
				meta, ok := src.Meta(n)
				if !ok || meta.DType != string(info.DType) || len(meta.Shape) != len(info.Shape) {
					t.Fatalf("tensor %s: meta %+v, header %+v", n, meta, info)
				}
			}
			if _, err := model.BindLayer(cfg, L, src); err != nil {
				t.Fatalf("binding streamed layer %d: %v", L, err)
			}
			sl.Release()
		}
		if _, err := p.Next(context.Background()); err != io.EOF {
			t.Fatalf("after the last layer: %v, want io.EOF", err)
		}
		st := p.Stats()
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if st.Bytes < s.Layout().TensorBytes {
			t.Errorf("pass read %d bytes, the layers hold %d", st.Bytes, s.Layout().TensorBytes)
		}
	}
}

// TestStreamSteadyStateAllocates measures a whole pass over a one-shard
// model with 4 KiB requests (hundreds of them): the only allocations are the
// pass's fixed setup (context, channels, goroutines, one file), none per
// layer or request.
func TestStreamSteadyStateAllocates(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 1)
	_, cfg, s := open(t, dir, streamer.Options{Slots: 3, ReadSize: 4096, Readers: 3})
	pass := func() {
		p, err := s.Start(context.Background(), 2)
		if err != nil {
			t.Fatal(err)
		}
		for L := 0; L < cfg.NumLayers; L++ {
			sl, err := p.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			sl.Release()
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	pass() // warm up
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const passes = 5
	for range passes {
		pass()
	}
	runtime.ReadMemStats(&after)
	mallocs := (after.Mallocs - before.Mallocs) / passes
	bytesPer := (after.TotalAlloc - before.TotalAlloc) / passes
	reqs := s.Layout().ReadBytes / 4096
	t.Logf("per pass: %d allocations, %d bytes (%d layers, ~%d requests, %d bytes read)", mallocs, bytesPer, cfg.NumLayers, reqs, s.Layout().ReadBytes)
	if mallocs > 40 || bytesPer > 16<<10 {
		t.Errorf("a pass allocates %d objects, %d bytes; want a small fixed setup (<= 40 objects, 16 KiB) independent of %d layers and ~%d requests",
			mallocs, bytesPer, cfg.NumLayers, reqs)
	}
}

// runPass consumes a pass and returns the layers it delivered and its error.
func runPass(s *streamer.Streamer, depth int, between func(L int)) (int, error) {
	p, err := s.Start(context.Background(), depth)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	n := 0
	for {
		sl, err := p.Next(context.Background())
		if err == io.EOF {
			return n, p.Close()
		}
		if err != nil {
			return n, err
		}
		if between != nil {
			between(sl.Layer())
		}
		sl.Release()
		n++
	}
}

// shardOf returns the file that holds layer L's first tensor.
func shardOf(t *testing.T, ck *safetensors.Checkpoint, L int) string {
	t.Helper()
	for _, n := range ck.Names() {
		if l, ok := model.LayerOf(n); ok && l == L {
			info, _ := ck.Tensor(n)
			return info.File
		}
	}
	t.Fatalf("no tensor of layer %d", L)
	return ""
}

// TestStreamFaults damages shards before and during passes: each failure
// names the layer and the file, later layers are not delivered, the ring is
// released, and once the file is restored the next pass reads everything.
// A shard replaced by a directory fails to open (O_DIRECT) or is refused
// as not a regular file (buffered).
func TestStreamFaults(t *testing.T) {
	for _, mode := range []streamer.IOMode{streamer.IOAuto, streamer.IOBuffered} {
		t.Run([]string{"auto", "direct", "buffered"}[mode], func(t *testing.T) { streamFaults(t, mode) })
	}
}

func streamFaults(t *testing.T, mode streamer.IOMode) {
	base := testmodel.Dir(t, "tiny", 1, 0) // one shard per layer
	dir := testmodel.Copy(t, base)
	ck, cfg, s := open(t, dir, streamer.Options{Slots: 2, ReadSize: 8192, Readers: 2, IO: mode})
	backup := t.TempDir()
	save := func(path string) func() {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		keep := filepath.Join(backup, filepath.Base(path))
		if err := os.WriteFile(keep, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return func() {
			os.RemoveAll(path)
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(name string, n int, err error, layer int, file string, want error) {
		t.Helper()
		var re *streamer.ReadError
		if !errors.As(err, &re) || re.Layer != layer || re.File != file {
			t.Fatalf("%s: err %v; want a ReadError for layer %d, %s", name, err, layer, file)
		}
		if want != nil && !errors.Is(err, want) {
			t.Fatalf("%s: err %v does not wrap %v", name, err, want)
		}
		if n > layer {
			t.Fatalf("%s: %d layers delivered past the failing layer %d", name, n, layer)
		}
		msg := err.Error()
		if !strings.Contains(msg, file) || !strings.Contains(msg, "layer ") {
			t.Fatalf("%s: message %q does not name the layer and file", name, msg)
		}
		t.Logf("%s: %v", name, err)
		if got, err := runPass(s, 1, nil); err != nil || got != cfg.NumLayers {
			t.Fatalf("%s: pass after restoring: %d layers, %v", name, got, err)
		}
	}

	// Truncated before the pass: found when the pass opens the shard.
	f5 := shardOf(t, ck, 5)
	restore := save(f5)
	if err := os.Truncate(f5, 1000); err != nil {
		t.Fatal(err)
	}
	n, err := runPass(s, 1, nil)
	restore()
	check("truncated", n, err, 5, f5, streamer.ErrTruncated)

	// Deleted mid-pass: the pass has not reached layer 6 when it goes.
	f6 := shardOf(t, ck, 6)
	restore = save(f6)
	n, err = runPass(s, 0, func(L int) {
		if L == 1 {
			os.Remove(f6)
		}
	})
	restore()
	check("deleted", n, err, 6, f6, os.ErrNotExist)

	// A read error: the shard is replaced by a directory.
	f4 := shardOf(t, ck, 4)
	restore = save(f4)
	os.Remove(f4)
	if err := os.Mkdir(f4, 0o755); err != nil {
		t.Fatal(err)
	}
	n, err = runPass(s, 1, nil)
	restore()
	check("unreadable", n, err, 4, f4, nil)
}

// TestStreamTruncatedWhileOpen truncates a shard the pass has already
// opened (two layers share it): the read of the later layer comes up short.
func TestStreamTruncatedWhileOpen(t *testing.T) {
	dir := testmodel.Copy(t, testmodel.Dir(t, "tiny", 1, 2))
	ck, _, s := open(t, dir, streamer.Options{Slots: 1, ReadSize: 4096, Readers: 1})
	f := shardOf(t, ck, 0)
	if shardOf(t, ck, 2) != f {
		t.Skip("layers 0 and 2 are in different shards")
	}
	var cut int64
	for _, n := range ck.Names() {
		if L, ok := model.LayerOf(n); ok && L == 2 {
			info, _ := ck.Tensor(n)
			if cut == 0 || info.Offset < cut {
				cut = info.Offset
			}
		}
	}
	n, err := runPass(s, 0, func(L int) {
		if L == 0 {
			if err := os.Truncate(f, cut+100); err != nil {
				t.Fatal(err)
			}
		}
	})
	var re *streamer.ReadError
	if !errors.As(err, &re) || re.Layer != 2 || !errors.Is(err, streamer.ErrTruncated) || n != 2 {
		t.Fatalf("got %d layers, err %v; want layers 0-1 then a truncation error at layer 2", n, err)
	}
	if !strings.Contains(err.Error(), "needs bytes up to") {
		t.Fatalf("message %q does not say what was missing", err)
	}
}

func TestStreamCancel(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	_, cfg, s := open(t, dir, streamer.Options{Slots: 2, ReadSize: 4096, Readers: 2})
	ctx, cancel := context.WithCancel(context.Background())
	p, err := s.Start(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(context.Background(), 1); !errors.Is(err, streamer.ErrBusy) {
		t.Fatalf("second Start: %v, want ErrBusy", err)
	}
	sl, err := p.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sl.Release()
	cancel()
	done := make(chan error, 1)
	go func() {
		for {
			sl, err := p.Next(context.Background())
			if err != nil {
				done <- err
				return
			}
			sl.Release()
		}
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) && err != io.EOF {
			t.Fatalf("after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Next did not return after the pass was cancelled")
	}
	p.Close()
	if got, err := runPass(s, 1, nil); err != nil || got != cfg.NumLayers {
		t.Fatalf("pass after a cancelled one: %d layers, %v", got, err)
	}
}

func TestRawRead(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	_, _, s := open(t, dir, streamer.Options{Slots: 1})
	n, d, err := s.RawRead(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if n < s.Layout().TensorBytes || d <= 0 {
		t.Fatalf("raw read %d bytes in %v; the layers hold %d", n, d, s.Layout().TensorBytes)
	}
}

// TestDirectRequired: IODirect either gets direct I/O or fails clearly.
func TestDirectRequired(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	lay, err := streamer.NewLayout(ck, cfg.NumLayers, streamer.DefaultAlign)
	if err != nil {
		t.Fatal(err)
	}
	s, err := streamer.New(lay, cpu.New(1), streamer.Options{Slots: 1, IO: streamer.IODirect})
	if err != nil {
		if !strings.Contains(err.Error(), "direct I/O") || errors.Is(err, syscall.ENOENT) {
			t.Fatalf("IODirect failed unclearly: %v", err)
		}
		return
	}
	defer s.Close()
	if !s.Direct() {
		t.Fatal("IODirect streamer is not direct")
	}
}

// TestLayoutRefusesStubs: a decode rank's copy of a checkpoint (its shards
// whole, the others header-only stubs) cannot be streamed by a prefill
// worker, which needs every layer: the layout is refused naming a stub,
// instead of streaming the stubs' holes as zero weights.
func TestLayoutRefusesStubs(t *testing.T) {
	src := testmodel.Dir(t, "tiny", 1, 0) // one shard per layer
	dst := filepath.Join(t.TempDir(), "rank0")
	if _, err := layout.Copy(context.Background(), src, dst, layout.Range{Lo: 0, Hi: 2, Globals: true}); err != nil {
		t.Fatal(err)
	}
	cfg, err := model.LoadConfig(filepath.Join(dst, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	_, err = streamer.NewLayout(ck, cfg.NumLayers, streamer.DefaultAlign)
	var se *safetensors.Error
	if !errors.Is(err, safetensors.ErrStub) || !errors.As(err, &se) || !strings.Contains(err.Error(), filepath.Base(se.File)) {
		t.Fatalf("a rank's copy streamed: %v", err)
	}
	if len(ck.Stubs()) == 0 {
		t.Fatal("the copy has no stubs")
	}
}
