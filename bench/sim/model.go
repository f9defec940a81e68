package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
)

// readAlign is the direct-I/O alignment the streamer widens runs to.
const readAlign = 4096

// Layer is one decoder layer as the simulator sees it.
type Layer struct {
	Index int
	Kind  model.LayerKind
	Dense bool
	// ReadBytes is what a weight pass reads for the layer: every tensor of
	// it (K3-SPEC §5.2 shapes and dtypes, from synth.Plan), aligned.
	ReadBytes int64
	// The layer's decode state on the wire (K3-SPEC §4, as the planner and
	// the router count it): fixed per sequence (KDA state and fp32 conv
	// tails) and per prompt token (MLA latent rows, BF16).
	StateFixed, StatePerToken int64
}

// State is the layer's state bytes for a sequence of tokens tokens.
func (l Layer) State(tokens int) int64 { return l.StateFixed + int64(tokens)*l.StatePerToken }

// Model is a K3-shaped model's sizes: per-layer weight bytes and state
// bytes, from its configuration alone (no weights needed).
type Model struct {
	Name   string
	Cfg    *model.Config
	Layers []Layer
	// ReadBytes is the sum over layers; EmbedRowBytes one BF16 embedding row.
	ReadBytes, EmbedRowBytes int64
	// SlotBytes is the largest layer's read: one ring slot.
	SlotBytes int64
	// Cost is the cost model's view of the model (the router's).
	Cost *costmodel.Model
}

// NewModel derives the sizes of cfg.
func NewModel(name string, cfg *model.Config) *Model {
	m := &Model{Name: name, Cfg: cfg, Layers: make([]Layer, cfg.NumLayers), Cost: costmodel.New(&cfg.Config, model.BF16.Size())}
	plan := synth.Plan(cfg)
	lat := int64(cfg.LatentWidth()) * int64(model.BF16.Size())
	kda := int64(cfg.KDAHeads*cfg.KDAHeadDim*cfg.KDAHeadDim+3*cfg.KDAProjDim()*(cfg.ConvKernel-1)) * 4
	for L := range m.Layers {
		var n int64
		for _, t := range plan.Layers[L] {
			n += t.Bytes()
		}
		n = (n + readAlign - 1) / readAlign * readAlign
		l := Layer{Index: L, Kind: cfg.LayerKind(L), Dense: cfg.IsDense(L), ReadBytes: n}
		switch l.Kind {
		case model.KDA:
			l.StateFixed = kda
		case model.MLA:
			l.StatePerToken = lat
		}
		m.Layers[L] = l
		m.ReadBytes += n
		m.SlotBytes = max(m.SlotBytes, n)
	}
	m.EmbedRowBytes = int64(cfg.HiddenSize) * int64(model.BF16.Size())
	return m
}

// LoadModel reads a model by preset name (configs/models, e.g. k3, tiny,
// small), config.json path, or checkpoint directory.
func LoadModel(ref string) (*Model, error) {
	var b []byte
	var err error
	name := ref
	switch st, serr := os.Stat(ref); {
	case serr == nil && st.IsDir():
		b, err = os.ReadFile(filepath.Join(ref, "config.json"))
		name = filepath.Base(filepath.Clean(ref))
	case serr == nil:
		b, err = os.ReadFile(ref)
		name = strings.TrimSuffix(filepath.Base(ref), ".json")
	default:
		b, err = configs.ModelPreset(ref)
	}
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", ref, err)
	}
	cfg, err := model.ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", ref, err)
	}
	return NewModel(name, cfg), nil
}

// StateBytes is a whole sequence's state of tokens tokens.
func (m *Model) StateBytes(tokens int) int64 {
	var n int64
	for _, l := range m.Layers {
		n += l.State(tokens)
	}
	return n
}

// Costs is the planner's memory model of the model on a box of the given
// backend threads.
func (m *Model) Costs(threads int) planner.Costs {
	return planner.ModelCosts(m.Cfg, model.BF16, m.SlotBytes, m.EmbedRowBytes, max(threads, 1))
}
