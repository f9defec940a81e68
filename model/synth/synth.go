// Package synth writes synthetic Kimi K3 checkpoints in the released layout
// (spec §5): config.json in the nested released shape, the released tensor
// names, shapes and dtypes (BF16 trunk, F32 conv/A_log/dt_bias/o_norm/router
// bias, MXFP4 routed experts), shards named model-NNNNN-of-NNNNNN with each
// layer's trunk tensors in one contiguous run, and the index json.
//
// Within a shard the data follows the order of the released files (the
// safetensors serializer's: wider dtypes first, then by name), and the
// headers carry no metadata, as the released ones: for the K3 preset the
// header and data bytes add up to the released files' sizes exactly.
//
// The vision tower and projector (from the config's vision_config) follow
// the text tower: in the released layout in two shards of their own, the
// projector's then the tower's, as released; with a chosen shard count in
// the last shard, after the model-level tensors.
//
// A sparse checkpoint (Options.Sparse) has the same files, headers and
// sizes with every tensor's data left as a hole: all weights read as zero
// and the files take almost no disk, so a full-size model (K3's 1.56 TB)
// can be planned and streamed on a machine that cannot hold it.
//
// Weights are random but scaled so that the model exercises its features:
// SiTU's gate and up caps saturate on part of the rows, the router bias
// changes which experts are selected, AttnRes weights are not uniform, and
// logits have a clear maximum (greedy decoding is stable). Presets whose
// vocabulary can hold one also get a synthetic tokenizer (tiktoken.model and
// tokenizer_config.json). Every tensor's
// values depend only on the seed and the tensor's name, so the same model
// comes out whatever the shard layout.
package synth

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tandem-inference/tandem/internal/diskfree"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/mxfp"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Version changes whenever the generated weights for a given seed change;
// caches key on it.
const Version = 3

// LayoutVersion changes whenever the files written for a given config and
// options change with the weights left alone (shards, tensor order,
// headers); caches of sparse checkpoints key on it.
const LayoutVersion = 2

// Options control a generation.
type Options struct {
	Seed uint64
	// Shards is the number of safetensors files. 0 means the released
	// layout: one shard per layer, one for the model-level tensors, and
	// the vision projector's and tower's two when the config has a tower.
	Shards int
	// Force allows writing into a non-empty directory.
	Force bool
	// Progress, if set, is called as bytes are written (done, total).
	Progress func(done, total int64)
	// Sparse leaves every tensor's data as a hole that reads as zeros
	// (see the package comment).
	Sparse bool
}

// ErrNotEmpty is returned when the output directory holds files and Force
// is not set.
var ErrNotEmpty = errors.New("output directory is not empty (use --force to overwrite)")

// Write generates the model described by configJSON (a released-shape
// config.json) into dir.
func Write(ctx context.Context, configJSON []byte, dir string, opt Options) error {
	cfg, err := model.ParseConfig(configJSON)
	if err != nil {
		return err
	}
	plan := Plan(cfg)
	shards := assignShards(cfg, plan, opt.Shards)
	projector, tower, err := VisionPlan(cfg)
	if err != nil {
		return err
	}
	if len(tower) > 0 {
		if opt.Shards <= 0 {
			// As released: the projector, then the tower, in the last two shards.
			shards = append(shards, shard{tensors: released(projector)}, shard{tensors: released(tower)})
		} else {
			last := &shards[len(shards)-1]
			last.tensors = append(last.tensors, released(append(projector, tower...))...)
		}
	}
	var total int64
	for _, sh := range shards {
		for _, t := range sh.tensors {
			total += t.Bytes()
		}
	}
	// A sparse model's data takes no disk; its headers are a few MB a shard.
	if free, ok := diskfree.Bytes(existingAncestor(dir)); ok && total > free && !opt.Sparse {
		return fmt.Errorf("%s: the model needs %.1f GiB, the filesystem has %.1f GiB free", dir, float64(total)/(1<<30), float64(free)/(1<<30))
	}
	if err := prepareDir(dir, opt.Force); err != nil {
		return err
	}
	var done atomic.Int64
	report := func(n int64) {
		d := done.Add(n)
		if opt.Progress != nil {
			opt.Progress(d, total)
		}
	}

	idx := &safetensors.Index{WeightMap: map[string]string{}}
	for i, sh := range shards {
		name := fmt.Sprintf("model-%05d-of-%06d.safetensors", i+1, len(shards))
		shards[i].file = name
		for _, t := range sh.tensors {
			idx.WeightMap[t.Name] = name
			idx.TotalSize += t.Bytes()
		}
	}
	// Shards are independent: write several at once.
	workers := min(runtime.GOMAXPROCS(0), 4, len(shards))
	jobs := make(chan shard)
	errs := make(chan error, len(shards))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sh := range jobs {
				if err := ctx.Err(); err != nil {
					errs <- err
					continue
				}
				errs <- writeShard(filepath.Join(dir, sh.file), sh.tensors, opt.Seed, opt.Sparse, report)
			}
		}()
	}
	for _, sh := range shards {
		jobs <- sh
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	if err := safetensors.WriteIndex(filepath.Join(dir, "model.safetensors.index.json"), idx); err != nil {
		return err
	}
	var pretty any
	if err := json.Unmarshal(configJSON, &pretty); err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	out, err := json.MarshalIndent(pretty, "", "  ")
	if err != nil {
		return err
	}
	if cfg.VocabSize >= tokenizer.MinSyntheticVocab {
		if err := tokenizer.WriteSynthetic(dir, cfg.VocabSize, tokenizer.DefaultCorpus()); err != nil {
			return fmt.Errorf("synthetic tokenizer: %w", err)
		}
	}
	// config.json last: its presence marks a complete model.
	return os.WriteFile(filepath.Join(dir, "config.json"), append(out, '\n'), 0o644)
}

// existingAncestor is dir or its nearest existing parent.
func existingAncestor(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

func prepareDir(dir string, force bool) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return err
	case len(ents) > 0 && !force:
		return fmt.Errorf("%s: %w", dir, ErrNotEmpty)
	}
	for _, e := range ents {
		// Only remove what a previous generation wrote.
		n := e.Name()
		switch {
		case filepath.Ext(n) == ".safetensors", n == "model.safetensors.index.json", n == "config.json",
			n == "tiktoken.model", n == "tokenizer_config.json":
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

type shard struct {
	file    string
	tensors []Tensor
}

// assignShards places tensors like the release: each layer's tensors
// together, in released order, layers in order over the shards, the
// model-level tensors in the last shard.
func assignShards(c *model.Config, p *TensorPlan, n int) []shard {
	if n <= 0 {
		n = c.NumLayers + 1
	}
	n = max(2, min(n, c.NumLayers+1))
	out := make([]shard, n)
	layerShards := n - 1
	for L := 0; L < c.NumLayers; L++ {
		i := L * layerShards / c.NumLayers
		out[i].tensors = append(out[i].tensors, released(p.Layers[L])...)
	}
	out[n-1].tensors = append(out[n-1].tensors, released(p.Globals)...)
	return out
}

// released returns ts in the order the released files store one shard's
// tensors, the safetensors serializer's: wider dtypes first (F32, then
// BF16, then the U8 of the MXFP4 experts), then by name, bytewise (so
// expert 10 comes before expert 2). Within a layer that puts every
// non-expert tensor before the experts, in one run.
func released(ts []Tensor) []Tensor {
	out := slices.Clone(ts)
	slices.SortStableFunc(out, func(a, b Tensor) int {
		return cmp.Or(cmp.Compare(b.DType.Size(), a.DType.Size()), strings.Compare(a.Name, b.Name))
	})
	return out
}

// writeShard writes one shard, with no header metadata: the released
// headers have none.
func writeShard(path string, ts []Tensor, seed uint64, sparse bool, report func(int64)) error {
	wt := make([]safetensors.WriteTensor, len(ts))
	var bytes int64
	for i, t := range ts {
		t := t
		wt[i] = safetensors.WriteTensor{Name: t.Name, DType: t.DType, Shape: t.Shape}
		if !sparse {
			wt[i].Fill = func(w io.Writer) error {
				return t.fill(&countingWriter{w: w, report: report}, seed)
			}
		}
		bytes += t.Bytes()
	}
	if sparse {
		if err := safetensors.WriteSparse(path, wt, nil); err != nil {
			return err
		}
		report(bytes)
		return nil
	}
	return safetensors.WriteFile(path, wt, nil)
}

type countingWriter struct {
	w      io.Writer
	report func(int64)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.report(int64(n))
	return n, err
}

// rngFor seeds a generator from the model seed and the tensor name, so a
// tensor's values do not depend on generation order or shard layout.
func rngFor(seed uint64, name string) *rand.ChaCha8 {
	h := fnv.New64a()
	h.Write([]byte(name))
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], seed)
	binary.LittleEndian.PutUint64(key[8:], h.Sum64())
	binary.LittleEndian.PutUint64(key[16:], Version)
	return rand.NewChaCha8(key)
}

// chunk is the write granularity of generated data.
const chunk = 1 << 20

func (t Tensor) fill(w io.Writer, seed uint64) error {
	rng := rngFor(seed, t.Name)
	n := t.Elems()
	buf := make([]byte, 0, chunk)
	flush := func() error {
		_, err := w.Write(buf)
		buf = buf[:0]
		return err
	}
	switch t.Kind {
	case KindPacked: // MXFP4 nibbles: every code equally likely
		left := t.Bytes()
		for left > 0 {
			m := min(left, chunk)
			buf = buf[:m]
			rng.Read(buf)
			if _, err := w.Write(buf); err != nil {
				return err
			}
			left -= m
		}
		return nil
	case KindScale: // E8M0 exponents in [Lo, Hi]
		span := uint64(t.Hi - t.Lo + 1)
		for i := int64(0); i < n; i++ {
			buf = append(buf, byte(t.Lo+int(rng.Uint64()%span)))
			if len(buf) == chunk {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return flush()
	}
	r := rand.New(rng)
	for i := int64(0); i < n; i++ {
		v := t.value(r, i)
		switch t.DType {
		case safetensors.BF16:
			u := mxfp.F32ToBF16(v)
			buf = append(buf, byte(u), byte(u>>8))
		case safetensors.F32:
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		if len(buf) >= chunk-4 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// value draws element i: uniform with the tensor's mean and std (a uniform
// of the right variance is as good as a normal for a synthetic model, and
// much cheaper).
func (t Tensor) value(r *rand.Rand, i int64) float32 {
	switch t.Kind {
	case KindALog:
		if i >= int64(t.Heads) {
			return 0 // the release pads A_log to head_dim with zeros
		}
		return float32(logPortable(1 + float64(15*float64(r.Float64())))) // exp(A_log) in [1, 16], as fla initialises it
	}
	// The product is rounded before the sum it feeds (float64()): Go fuses
	// them on arm64, and a checkpoint's bytes must not depend on the
	// machine that wrote it. 2(u-0.5) is 2u-1, exactly, with nothing to fuse.
	return float32(t.Mean + float64(t.Std*math.Sqrt(3)*(2*(float64(r.Float64())-0.5))))
}

// logPortable is math.Log for normal positive x with the bits of Go's
// amd64 routine on every architecture: the same reduction and polynomial,
// every product rounded before the sum it feeds (math.Log's portable code
// has its multiply-adds fused on arm64).
func logPortable(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
		l1    = 6.666666666666735130e-01
		l2    = 3.999999999940941908e-01
		l3    = 2.857142874366239149e-01
		l4    = 2.222219843214978396e-01
		l5    = 1.818357216161805012e-01
		l6    = 1.531383769920937332e-01
		l7    = 1.479819860511658591e-01
	)
	f1, ki := math.Frexp(x)
	if f1 <= math.Sqrt2/2 {
		f1 *= 2
		ki--
	}
	f := float64(f1) - 1
	k := float64(ki)
	s := f / (2 + f)
	s2 := s * s
	s4 := s2 * s2
	a := float64(l7*s4) + l5
	a = float64(a*s4) + l3
	a = float64(a*s4) + l1
	b := float64(l6*s4) + l4
	b = float64(b*s4) + l2
	rr := float64(s2*a) + float64(s4*b)
	hfsq := float64(0.5 * f * f)
	u := float64(s*(hfsq+rr)) + float64(k*ln2Lo)
	return float64(k*ln2Hi) - ((hfsq - u) - f)
}
