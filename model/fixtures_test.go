package model

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/fixture"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
)

// Fixture tolerance: abs 1e-5 / rel 1e-4 (fp32 reference, see
// testdata/k3-ops/README.md).
const fixAbs, fixRel = 1e-5, 1e-4

// fixtureConfig is the small model of testdata/k3-ops/MANIFEST.json (the
// layer fixtures' shapes), with the latent-norm eps of the engine that made
// the vectors (1e-5, spec §7 Q1).
const fixtureConfig = `{
  "model_type": "kimi_k3",
  "text_config": {
    "hidden_size": 128, "num_hidden_layers": 13, "vocab_size": 256, "rms_norm_eps": 1e-5,
    "mla_latent_norm_eps": 1e-5, "tie_word_embeddings": false,
    "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 24,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "mla_use_nope": true, "mla_use_output_gate": true,
    "first_k_dense_replace": 1, "intermediate_size": 96, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 2,
    "moe_intermediate_size": 48, "routed_expert_hidden_size": 64, "latent_moe_use_norm": true,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": true, "routed_scaling_factor": 1.0,
    "num_expert_group": 1, "topk_group": 1, "attn_res_block_size": 3, "num_nextn_predict_layers": 0,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 13], "num_heads": 4, "head_dim": 16,
      "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "use_full_rank_gate": true,
      "a_log_stored_length": 4}
  }
}`

func fixtureCfg(t *testing.T) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(fixtureConfig))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func loadFixture(t *testing.T, name string) *fixture.Fixture {
	t.Helper()
	f, err := fixture.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func fixTensor(t *testing.T, f *fixture.Fixture, name string) *fixture.Tensor {
	t.Helper()
	x, err := f.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func expectClose(t *testing.T, what string, got, want []float32) {
	t.Helper()
	ok, idx, maxErr := fixture.Close(got, want, fixAbs, fixRel)
	if !ok {
		if idx < 0 {
			t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
		}
		t.Fatalf("%s: element %d = %g, want %g (max abs err %g)", what, idx, got[idx], want[idx], maxErr)
	}
	t.Logf("%s: max abs err %.3g over %d values", what, maxErr, len(got))
}

// fixtureSource serves a layer fixture's weights under their released
// checkpoint names, so the fixtures also exercise the name binding.
type fixtureSource struct {
	f      *fixture.Fixture
	prefix string // field-name prefix inside the fixture ("" or "self_attn_" ...)
	t      *testing.T
}

// fixtureName maps a released name (below the layer prefix) to the
// fixture's field name.
func fixtureName(name string) string {
	for _, r := range []struct{ from, to string }{
		{"block_sparse_moe.gate.weight", "mlp_gate_weight"},
		{"block_sparse_moe.gate.e_score_correction_bias", "mlp_e_score_correction_bias"},
		{"block_sparse_moe.routed_expert_down_proj.weight", "mlp_down_weight"},
		{"block_sparse_moe.routed_expert_up_proj.weight", "mlp_up_weight"},
		{"block_sparse_moe.routed_expert_norm.weight", "mlp_norm_weight"},
		{"block_sparse_moe.shared_experts.gate_proj.weight", "mlp_shared_w1_weight"},
		{"block_sparse_moe.shared_experts.up_proj.weight", "mlp_shared_w3_weight"},
		{"block_sparse_moe.shared_experts.down_proj.weight", "mlp_shared_w2_weight"},
	} {
		if name == r.from {
			return r.to
		}
	}
	name = strings.Replace(name, "block_sparse_moe.", "mlp.", 1)
	return strings.ReplaceAll(name, ".", "_")
}

func (s fixtureSource) lookup(name string) (*fixture.Tensor, bool) {
	rest, ok := strings.CutPrefix(name, LayerPrefix(layerOf(name)))
	if !ok {
		return nil, false
	}
	field := s.prefix + fixtureName(rest)
	if !s.f.Has(field) {
		return nil, false
	}
	x, err := s.f.Tensor(field)
	if err != nil {
		s.t.Fatal(err)
	}
	return x, true
}

func layerOf(name string) int {
	var L int
	fmt.Sscanf(strings.TrimPrefix(name, "language_model.model.layers."), "%d", &L)
	return L
}

func (s fixtureSource) Meta(name string) (TensorMeta, bool) {
	x, ok := s.lookup(name)
	if !ok {
		return TensorMeta{}, false
	}
	shape := make([]int64, len(x.Shape))
	for i, d := range x.Shape {
		shape[i] = int64(d)
	}
	return TensorMeta{DType: "F32", Shape: shape}, true
}

func (s fixtureSource) Data(name string) ([]byte, error) {
	x, ok := s.lookup(name)
	if !ok {
		return nil, fmt.Errorf("no fixture tensor for %s", name)
	}
	return kernels.NewF32Matrix(name, 1, len(x.Data), x.Data).Data, nil
}

// stateFor gives a fresh fp32-cache state for layer L.
func stateFor(c *Config, L int) *SeqState {
	s := &SeqState{Layers: make([]*LayerState, c.NumLayers)}
	s.Layers[L] = c.NewLayerState(L, StateOptions{LatentDType: F32})
	return s
}

func batchOf(be kernels.Backend, s *SeqState, x *fixture.Tensor) *Batch {
	T, d := x.Shape[len(x.Shape)-2], x.Shape[len(x.Shape)-1]
	t := be.NewTensor(T, d)
	copy(t.Data, x.Data)
	return &Batch{Seqs: []*SeqState{s}, Spans: []kernels.Span{{Lo: 0, Hi: T}}, Partial: t}
}

func TestFixtureKDAAttention(t *testing.T) {
	c := fixtureCfg(t)
	for _, name := range []string{"kda_layer1", "kda_layer8"} {
		f := loadFixture(t, name)
		w := &KDAWeights{}
		src := kdaFixtureSource{f: f, t: t}
		var b binder
		b.src = src
		b.bindFields(w, LayerPrefix(0)+"self_attn.")
		if b.err != nil {
			t.Fatal(b.err)
		}
		for _, phase := range []Phase{PhasePrefill, PhaseDecode} {
			m := New(c, cpu.New(2))
			s := stateFor(c, 0)
			batch := batchOf(m.Backend, s, fixTensor(t, f, "in"))
			var y *kernels.Tensor
			if phase == PhaseDecode {
				// Decode form, token by token.
				T := batch.Partial.Rows
				y = m.Backend.NewTensor(T, c.HiddenSize)
				for r := 0; r < T; r++ {
					one := &Batch{Seqs: batch.Seqs, Spans: []kernels.Span{{Lo: 0, Hi: 1}}, Partial: batch.Partial.RowsView(r, r+1)}
					copy(y.Row(r), m.kdaForward(0, w, one.Partial, one, PhaseDecode).Data)
				}
			} else {
				y = m.kdaForward(0, w, batch.Partial, batch, phase)
			}
			expectClose(t, fmt.Sprintf("%s phase %d out", name, phase), y.Data, fixTensor(t, f, "out").Data)
			expectClose(t, fmt.Sprintf("%s phase %d state", name, phase), s.Layers[0].Part(PartKDAState).F32(), fixTensor(t, f, "state_out").Data)
		}
	}
}

// kdaFixtureSource maps the kda_layer fixtures' short names.
type kdaFixtureSource struct {
	f *fixture.Fixture
	t *testing.T
}

func (s kdaFixtureSource) field(name string) string {
	rest := strings.TrimPrefix(name, LayerPrefix(0)+"self_attn.")
	rest = strings.TrimSuffix(rest, ".weight")
	rest = strings.TrimSuffix(rest, "_proj")
	rest = strings.TrimSuffix(rest, "1d")
	switch rest {
	case "q", "k", "v", "g", "o", "b":
		return rest + "_proj"
	}
	return rest
}

func (s kdaFixtureSource) Meta(name string) (TensorMeta, bool) {
	f := s.field(name)
	if !s.f.Has(f) {
		return TensorMeta{}, false
	}
	x := fixTensor(s.t, s.f, f)
	shape := make([]int64, len(x.Shape))
	for i, d := range x.Shape {
		shape[i] = int64(d)
	}
	return TensorMeta{DType: "F32", Shape: shape}, true
}

func (s kdaFixtureSource) Data(name string) ([]byte, error) {
	x := fixTensor(s.t, s.f, s.field(name))
	return kernels.NewF32Matrix(name, 1, len(x.Data), x.Data).Data, nil
}

func TestFixtureMLAAttention(t *testing.T) {
	c := fixtureCfg(t)
	f := loadFixture(t, "mla")
	mat := func(field, name string) *kernels.Matrix {
		x := fixTensor(t, f, field)
		return kernels.NewF32Matrix(name, x.Shape[0], x.Shape[1], x.Data)
	}
	w := &MLAWeights{
		QAProj: mat("q_a_proj_weight", "q_a_proj"), QANorm: fixTensor(t, f, "q_a_layernorm_weight").Data,
		QBProj: mat("q_b_proj_weight", "q_b_proj"), KVAProj: mat("kv_a_proj_with_mqa_weight", "kv_a_proj_with_mqa"),
		KVANorm: fixTensor(t, f, "kv_a_layernorm_weight").Data, KVBProj: mat("kv_b_proj_weight", "kv_b_proj"),
		OProj: mat("o_proj_weight", "o_proj"), GProj: mat("g_proj_weight", "g_proj"),
	}
	const L = 3 // an MLA layer of the fixture config
	in := fixTensor(t, f, "in")
	T := in.Shape[1]
	for _, phase := range []Phase{PhasePrefill, PhaseDecode} {
		m := New(c, cpu.New(2))
		s := stateFor(c, L)
		batch := batchOf(m.Backend, s, in)
		y := m.Backend.NewTensor(T, c.HiddenSize)
		if phase == PhasePrefill {
			y = m.mlaForward(L, w, batch.Partial, batch, phase)
		} else {
			for r := 0; r < T; r++ {
				one := &Batch{Seqs: batch.Seqs, Spans: []kernels.Span{{Lo: 0, Hi: 1}}, Partial: batch.Partial.RowsView(r, r+1)}
				copy(y.Row(r), m.mlaForward(L, w, one.Partial, one, phase).Data)
			}
		}
		expectClose(t, fmt.Sprintf("mla phase %d out", phase), y.Data, fixTensor(t, f, "out").Data)
		// The cache holds normalised c_kv then raw k_pe.
		cache := s.Layers[L].Part(PartLatent).F32()
		kvl, kpe := fixTensor(t, f, "kv_latent"), fixTensor(t, f, "k_rope")
		var gotLat, gotPE []float32
		for r := 0; r < T; r++ {
			row := cache[r*c.LatentWidth() : (r+1)*c.LatentWidth()]
			gotLat = append(gotLat, row[:c.KVLoraRank]...)
			gotPE = append(gotPE, row[c.KVLoraRank:]...)
		}
		expectClose(t, "mla cached c_kv", gotLat, kvl.Data)
		expectClose(t, "mla cached k_pe", gotPE, kpe.Data)
	}
}

func runFixtureMoE(t *testing.T, f *fixture.Fixture) []float32 {
	c := fixtureCfg(t)
	mat := func(field string) *kernels.Matrix {
		x := fixTensor(t, f, field)
		return kernels.NewF32Matrix(field, x.Shape[0], x.Shape[1], x.Data)
	}
	w := &MoEWeights{
		Router: mat("gate_weight"), RouterBias: fixTensor(t, f, "e_score_correction_bias").Data,
		LatentDown: mat("down_weight"), LatentUp: mat("up_weight"), LatentNorm: fixTensor(t, f, "norm_weight").Data,
		Shared: &FFNWeights{GateProj: mat("shared_w1_weight"), UpProj: mat("shared_w3_weight"), DownProj: mat("shared_w2_weight")},
	}
	for e := 0; e < c.NumExperts; e++ {
		p := fmt.Sprintf("experts_%d_", e)
		w.Experts = append(w.Experts, kernels.Expert{W1: mat(p + "w1_weight"), W3: mat(p + "w3_weight"), W2: mat(p + "w2_weight")})
	}
	m := New(c, cpu.New(2))
	in := fixTensor(t, f, "in")
	x := m.Backend.NewTensor(in.Shape[1], in.Shape[2])
	copy(x.Data, in.Data)
	return m.moeForward(w, x).Data
}

// TestFixtureDecoderLayers runs whole decoder layers (AttnRes in and out,
// block push on the MLA one) with weights bound by their released names.
func TestFixtureDecoderLayers(t *testing.T) {
	c := fixtureCfg(t)
	for _, name := range []string{"layer_kda", "layer_mla"} {
		f := loadFixture(t, name)
		idx, err := f.Float("layer_idx")
		if err != nil {
			t.Fatal(err)
		}
		L := int(idx)
		l, err := BindLayer(c, L, fixtureSource{f: f, t: t})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m := New(c, cpu.New(2))
		s := stateFor(c, L)
		batch := batchOf(m.Backend, s, fixTensor(t, f, "in"))
		stackIn := fixTensor(t, f, "block_residual_in")
		T, n, d := stackIn.Shape[0], stackIn.Shape[1], stackIn.Shape[2]
		for j := 0; j < n; j++ {
			st := m.Backend.NewTensor(T, d)
			for r := 0; r < T; r++ {
				copy(st.Row(r), stackIn.Data[(r*n+j)*d:(r*n+j+1)*d])
			}
			batch.Stack = append(batch.Stack, st)
		}
		// The fixture's stack depth is its own (not the model's), so call the
		// layer directly rather than through RunLayer's depth check.
		if err := m.forwardLayer(context.Background(), l, batch, PhasePrefill); err != nil {
			t.Fatal(err)
		}
		expectClose(t, name+" out", batch.Partial.Data, fixTensor(t, f, "out").Data)
		stackOut := fixTensor(t, f, "block_residual_out")
		no := stackOut.Shape[1]
		if len(batch.Stack) != no {
			t.Fatalf("%s: stack depth %d, want %d", name, len(batch.Stack), no)
		}
		var got []float32
		for r := 0; r < T; r++ {
			for j := 0; j < no; j++ {
				got = append(got, batch.Stack[j].Row(r)...)
			}
		}
		expectClose(t, name+" stack out", got, stackOut.Data)
	}
}
