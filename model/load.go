package model

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model/safetensors"
)

// CheckpointSource adapts an open safetensors checkpoint (mmapped) to
// TensorSource.
type CheckpointSource struct{ C *safetensors.Checkpoint }

func (s CheckpointSource) Meta(name string) (TensorMeta, bool) {
	t, ok := s.C.Tensor(name)
	if !ok {
		return TensorMeta{}, false
	}
	return TensorMeta{DType: string(t.DType), Shape: t.Shape}, true
}

func (s CheckpointSource) Data(name string) ([]byte, error) { return s.C.Bytes(name) }

// LoadOptions choose what a holder keeps resident.
type LoadOptions struct {
	// Layers [Lo, Hi) to bind; Hi 0 means every layer.
	Lo, Hi int
	// Embed and Head bind the embedding and the final mix/norm/lm_head.
	Embed, Head bool
	// LatentNormEps overrides the MLA latent norm eps (0 keeps the config's).
	LatentNormEps float64
	// Pin keeps the bound weights in memory (safetensors.Checkpoint.Pin):
	// a server's, whose requests must not wait for the disk.
	Pin bool
	// Shard binds only a tensor rank's slices (shard.go); the zero Shard
	// binds every weight.
	Shard Shard
}

// Loaded is a model bound to an open checkpoint; Close releases the
// mappings (the model must not be used afterwards).
type Loaded struct {
	*Model
	Checkpoint *safetensors.Checkpoint
	// PinErr is why the weights could not be locked in memory (with
	// LoadOptions.Pin; they were faulted in all the same): the caller
	// reports it, since they may be paged out again under pressure.
	PinErr error
}

// Close unmaps the checkpoint.
func (l *Loaded) Close() error { return l.Checkpoint.Close() }

// Load opens the checkpoint in dir (config.json + shards) and binds the
// requested layers on the backend; weights are used in place from the mapped
// files.
func Load(dir string, be kernels.Backend, opt LoadOptions) (*Loaded, error) {
	cfg, ck, err := OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	if opt.LatentNormEps > 0 {
		cfg.LatentNormEps = opt.LatentNormEps
	}
	if opt.Hi == 0 {
		opt.Hi = cfg.NumLayers
	}
	if opt.Lo < 0 || opt.Lo > opt.Hi || opt.Hi > cfg.NumLayers {
		ck.Close()
		return nil, fmt.Errorf("layer range [%d, %d) is outside the model's %d layers", opt.Lo, opt.Hi, cfg.NumLayers)
	}
	m := New(cfg, be)
	var src TensorSource = CheckpointSource{ck}
	var views [][]byte
	if opt.Pin && !opt.Shard.Split() {
		src = viewsOf{src, &views}
	}
	if err := cfg.CheckShard(max(opt.Shard.Ranks, 1)); err != nil {
		ck.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	m.Shard, m.State.Shard = opt.Shard, opt.Shard
	fail := func(err error) (*Loaded, error) {
		ck.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if opt.Embed || opt.Head {
		g, err := BindGlobals(cfg, src)
		if err != nil {
			return fail(err)
		}
		m.Globals = ShardGlobals(cfg, g, opt.Shard)
	}
	for L := opt.Lo; L < opt.Hi; L++ {
		l, err := BindLayerShard(cfg, L, src, opt.Shard)
		if err != nil {
			return fail(err)
		}
		if err := bindAll(be, l); err != nil {
			return fail(err)
		}
		m.Layers[L] = l
	}
	if m.Globals != nil {
		for _, w := range []*kernels.Matrix{m.Globals.Embed, m.Globals.LMHead} {
			if err := be.Bind(w); err != nil {
				return fail(err)
			}
		}
	}
	ld := &Loaded{Model: m, Checkpoint: ck}
	if opt.Pin && opt.Shard.Split() {
		views = shardViews(m)
	}
	for _, v := range views {
		if err := ck.Pin(v); err != nil && ld.PinErr == nil {
			ld.PinErr = fmt.Errorf("%s: weights not locked in memory: %w", dir, err)
		}
	}
	return ld, nil
}

// shardViews lists the bytes a tensor rank's weights use: its slices, not
// the whole tensors they were cut from.
func shardViews(m *Model) [][]byte {
	var ws []*kernels.Matrix
	for _, l := range m.Layers {
		if l != nil {
			ws = append(ws, l.Matrices()...)
		}
	}
	if g := m.Globals; g != nil {
		ws = append(ws, g.Embed, g.LMHead)
	}
	var out [][]byte
	for _, w := range ws {
		if w != nil {
			out = append(out, w.Data, w.Scales)
		}
	}
	return out
}

// viewsOf records the tensor bytes a source hands out, to pin them.
type viewsOf struct {
	TensorSource
	views *[][]byte
}

func (s viewsOf) Data(name string) ([]byte, error) {
	b, err := s.TensorSource.Data(name)
	if err == nil {
		*s.views = append(*s.views, b)
	}
	return b, err
}

// OpenCheckpoint reads dir's config.json and opens its checkpoint (index
// and shard headers, no tensor data), and checks the config against the
// checkpoint before anything is sized by the config: the layers the config
// counts are the layers the checkpoint holds, and the embedding has the
// config's vocabulary and width. A config.json that claims more than the
// files hold is refused here, naming both.
func OpenCheckpoint(dir string) (*Config, *safetensors.Checkpoint, error) {
	cfg, err := LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, nil, err
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := CheckCheckpoint(cfg, ck); err != nil {
		ck.Close()
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	return cfg, ck, nil
}

// CheckCheckpoint checks a validated config against an open checkpoint's
// tensor names and header shapes. Its memory is bounded by the config's
// limits and the checkpoint's own size.
func CheckCheckpoint(cfg *Config, ck *safetensors.Checkpoint) error {
	seen := make([]bool, cfg.NumLayers)
	for _, name := range ck.Names() {
		L, ok := LayerOf(name)
		if !ok || L == GlobalsGroup {
			continue
		}
		if L >= cfg.NumLayers {
			return fmt.Errorf("config.json num_hidden_layers is %d, but the checkpoint holds tensor %s of layer %d", cfg.NumLayers, name, L)
		}
		seen[L] = true
	}
	for L, ok := range seen {
		if !ok {
			return fmt.Errorf("config.json num_hidden_layers is %d, but the checkpoint holds no tensor of layer %d", cfg.NumLayers, L)
		}
	}
	// The embedding is the one tensor every holder sizes by the config's
	// vocabulary and width (rank 0's rows, the prefill worker's reads).
	const embed = "language_model.model.embed_tokens.weight"
	if t, ok := ck.Tensor(embed); ok {
		if len(t.Shape) != 2 || t.Shape[0] != int64(cfg.VocabSize) || t.Shape[1] != int64(cfg.HiddenSize) {
			return fmt.Errorf("tensor %s has shape %v; config.json vocab_size %d and hidden_size %d need [%d, %d]",
				embed, t.Shape, cfg.VocabSize, cfg.HiddenSize, cfg.VocabSize, cfg.HiddenSize)
		}
	}
	return nil
}

// bindAll hands every matrix of a layer to the backend.
func bindAll(be kernels.Backend, l *Layer) error {
	for _, w := range l.Matrices() {
		if err := be.Bind(w); err != nil {
			return err
		}
	}
	return nil
}

// Matrices lists every weight matrix of the layer.
func (l *Layer) Matrices() []*kernels.Matrix {
	var out []*kernels.Matrix
	if w := l.KDA; w != nil {
		out = append(out, w.QProj, w.KProj, w.VProj, w.GProj, w.OProj, w.FAProj, w.FBProj, w.BProj)
	}
	if w := l.MLA; w != nil {
		out = append(out, w.QAProj, w.QBProj, w.KVAProj, w.KVBProj, w.OProj, w.GProj)
	}
	ffn := func(f *FFNWeights) {
		if f != nil {
			out = append(out, f.GateProj, f.UpProj, f.DownProj)
		}
	}
	ffn(l.Dense)
	if w := l.MoE; w != nil {
		out = append(out, w.Router, w.LatentDown, w.LatentUp)
		ffn(w.Shared)
		for _, e := range w.Experts {
			out = append(out, e.W1, e.W3, e.W2)
		}
	}
	return out
}

// GlobalsGroup is the LayerOf group of the model-level tensors.
const GlobalsGroup = -1

// LayerOf maps a text tensor name to its layer (or GlobalsGroup for the
// embedding, final norm, output mix and lm_head); ok is false for other
// tensors (the vision tower).
func LayerOf(name string) (int, bool) {
	if rest, ok := strings.CutPrefix(name, "language_model.model.layers."); ok {
		num, _, found := strings.Cut(rest, ".")
		L, err := strconv.Atoi(num)
		if !found || err != nil || L < 0 {
			return 0, false
		}
		return L, true
	}
	if strings.HasPrefix(name, "language_model.") {
		return GlobalsGroup, true
	}
	return 0, false
}

// LayerRuns is the per-layer byte-range index: for every layer (and
// GlobalsGroup) the coalesced file byte runs that hold its tensors, in file
// order. The prefill streamer reads layers by it.
func LayerRuns(ck *safetensors.Checkpoint) map[int][]safetensors.Run {
	return ck.GroupRuns(LayerOf)
}
