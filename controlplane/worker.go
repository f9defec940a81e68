package controlplane

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tandem-inference/tandem/costmodel"
)

// WorkerKind is what a worker does.
type WorkerKind string

const (
	KindPrefill WorkerKind = "prefill" // streams weights, prefills prompts, ships state
	KindDecode  WorkerKind = "decode"  // one rank of a decode group
)

// LayerRange is the half-open layer interval [First, End).
type LayerRange struct {
	First int `msgpack:"first" json:"first"`
	End   int `msgpack:"end" json:"end"`
}

// IsZero reports whether the range is unset; it drives omitempty.
func (r LayerRange) IsZero() bool { return r == LayerRange{} }

// Len is the number of layers in the range.
func (r LayerRange) Len() int { return r.End - r.First }

// Contains reports whether layer is in the range.
func (r LayerRange) Contains(layer int) bool { return layer >= r.First && layer < r.End }

func (r LayerRange) String() string { return fmt.Sprintf("[%d,%d)", r.First, r.End) }

func (r LayerRange) validate(msg, field string) error {
	if r.First < 0 || r.End <= r.First {
		return fieldErr(msg, field, "is %v, want 0 <= first < end", r)
	}
	return nil
}

// Rates are a worker's measured figures, which the coordinator's cost model
// folds into its estimates.
type Rates struct {
	// PrefillTokensPerSec is the prompt tokens per second of prefill
	// compute, of a prefill worker or of a decode group prefilling locally.
	PrefillTokensPerSec float64 `msgpack:"prefill_tok_s,omitempty" json:"prefill_tok_s,omitempty"`
	// DecodeTokensPerSec is the tokens per second of one decoded sequence.
	DecodeTokensPerSec float64 `msgpack:"decode_tok_s,omitempty" json:"decode_tok_s,omitempty"`
	// PassFloor is a prefill worker's time of one weight pass with nothing
	// to compute, the floor of a layer-streamed prefill.
	PassFloor time.Duration `msgpack:"pass_floor_ns,omitempty" json:"pass_floor_ns,omitempty"`
	// LinkBytesPerSec is the measured state-transfer bandwidth towards
	// decode ranks.
	LinkBytesPerSec float64 `msgpack:"link_bytes_s,omitempty" json:"link_bytes_s,omitempty"`
	// ReadBytesPerSec is a prefill worker's measured weight read rate, the
	// bytes read over the time reads were in flight, so that a pass that
	// compute held back still measures the disk. PassFloor is its weights'
	// bytes over this rate.
	ReadBytesPerSec float64 `msgpack:"read_bytes_s,omitempty" json:"read_bytes_s,omitempty"`
	// Compute is the worker's compute per cost-model term, fitted to its
	// finished prefills, nil before the first. A decode group's rank 0
	// advertises the fit of the group's own prefills.
	Compute *ComputeTerms `msgpack:"compute,omitempty" json:"compute,omitempty"`
	// VisionGFLOPS is the worker's measured vision tower rate, GFLOP/s
	// over costmodel's count of the tower's work, over the images it ran
	// (a prefill worker, or a decode group's rank 0); 0 before the first.
	VisionGFLOPS float64 `msgpack:"vision_gflops,omitempty" json:"vision_gflops,omitempty"`
}

// ComputeTerms are fitted compute rates per term of package costmodel:
// GFLOP/s of the KDA layers' work, the MLA projections, the MLA
// attention over the cache, the MoE and the dense feed-forward layers, and
// the fixed cost of one layer call.
type ComputeTerms struct {
	KDA     float64       `msgpack:"kda_gflops" json:"kda_gflops"`
	MLA     float64       `msgpack:"mla_gflops" json:"mla_gflops"`
	Attn    float64       `msgpack:"attn_gflops" json:"attn_gflops"`
	MoE     float64       `msgpack:"moe_gflops" json:"moe_gflops"`
	Dense   float64       `msgpack:"dense_gflops" json:"dense_gflops"`
	Layer   time.Duration `msgpack:"layer_ns" json:"layer_ns"`
	Samples int           `msgpack:"samples" json:"samples"`
	// WorstError is the fit's largest relative error over its samples.
	WorstError float64 `msgpack:"worst_error" json:"worst_error"`
}

// TermsOf is the heartbeat form of fitted terms, nil before any sample.
func TermsOf(c costmodel.Compute, samples int, worst float64) *ComputeTerms {
	if samples <= 0 {
		return nil
	}
	return &ComputeTerms{KDA: c.KDA, MLA: c.MLA, Attn: c.Attention(), MoE: c.MoE, Dense: c.Dense, Layer: c.Layer,
		Samples: samples, WorstError: worst}
}

// Compute is the cost model's view of the terms.
func (c *ComputeTerms) Compute() costmodel.Compute {
	return costmodel.Compute{KDA: c.KDA, MLA: c.MLA, MLAAttention: c.Attn, MoE: c.MoE, Dense: c.Dense, Layer: c.Layer}
}

func (c *ComputeTerms) validate(msg, field string) error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"kda_gflops", c.KDA}, {"mla_gflops", c.MLA}, {"attn_gflops", c.Attn}, {"moe_gflops", c.MoE}, {"dense_gflops", c.Dense},
		{"worst_error", c.WorstError}} {
		if err := checkRate(msg, field+"."+f.name, f.v); err != nil {
			return err
		}
	}
	if c.Layer < 0 {
		return fieldErr(msg, field+".layer_ns", "is %d, must be >= 0", c.Layer)
	}
	if c.Samples < 0 {
		return fieldErr(msg, field+".samples", "is %d, must be >= 0", c.Samples)
	}
	return nil
}

func (r *Rates) validate(msg, field string) error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"prefill_tok_s", r.PrefillTokensPerSec}, {"decode_tok_s", r.DecodeTokensPerSec}, {"link_bytes_s", r.LinkBytesPerSec},
		{"read_bytes_s", r.ReadBytesPerSec}, {"vision_gflops", r.VisionGFLOPS}} {
		if err := checkRate(msg, field+"."+f.name, f.v); err != nil {
			return err
		}
	}
	if r.PassFloor < 0 {
		return fieldErr(msg, field+".pass_floor_ns", "is %d, must be >= 0", r.PassFloor)
	}
	if r.Compute != nil {
		return r.Compute.validate(msg, field+".compute")
	}
	return nil
}

// Endpoints are the network addresses (host:port) a worker serves.
type Endpoints struct {
	Transfer string `msgpack:"transfer,omitempty" json:"transfer,omitempty"` // kvtransfer receiver (decode ranks)
	Pipeline string `msgpack:"pipeline,omitempty" json:"pipeline,omitempty"` // rank-to-rank activations (decode ranks)
	Metrics  string `msgpack:"metrics,omitempty" json:"metrics,omitempty"`   // Prometheus /metrics
}

func (e *Endpoints) validate(msg, field string) error {
	for _, f := range []struct{ name, addr string }{{"transfer", e.Transfer}, {"pipeline", e.Pipeline}, {"metrics", e.Metrics}} {
		if err := checkAddr(msg, field+"."+f.name, f.addr); err != nil {
			return err
		}
	}
	return nil
}

// checkTensor checks a decode rank's tensor fields: 0 <= tensor_rank <
// tensor_ranks (both 0 when unsplit), and rank = stage·tensor_ranks +
// tensor_rank. prefix names the enclosing field ("" or "placement[i].").
func checkTensor(msg, prefix string, rank, t, T int) error {
	switch {
	case T < 0 || T > MaxTensorRanks:
		return fieldErr(msg, prefix+"tensor_ranks", "is %d, want 0 (unsplit) to %d", T, MaxTensorRanks)
	case t < 0 || t >= max(T, 1):
		return fieldErr(msg, prefix+"tensor_rank", "is %d with tensor_ranks %d, want 0 <= tensor_rank < tensor_ranks", t, T)
	case rank%max(T, 1) != t:
		return fieldErr(msg, prefix+"tensor_rank", "is %d at rank %d with tensor_ranks %d: ranks are numbered stage x tensor_ranks + tensor_rank", t, rank, T)
	}
	return nil
}

// MaxTensorRanks bounds a stage's tensor ranks.
const MaxTensorRanks = 64

func checkAddr(msg, field, addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fieldErr(msg, field, "%q is not host:port: %v", addr, err)
	}
	if host == "" {
		return fieldErr(msg, field, "%q has no host: give an address other workers can reach", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fieldErr(msg, field, "%q has port %q, want 1-65535", addr, port)
	}
	return nil
}

// WorkerInfo describes a worker and its current load. It is the heartbeat:
// each worker puts its WorkerInfo into the registry every heartbeat interval.
type WorkerInfo struct {
	ID      string     `msgpack:"id" json:"id"`
	Kind    WorkerKind `msgpack:"kind" json:"kind"`
	Backend string     `msgpack:"backend" json:"backend"`                 // cpu, cuda, metal
	Model   string     `msgpack:"model,omitempty" json:"model,omitempty"` // model identity; workers of one job must agree
	Version string     `msgpack:"version,omitempty" json:"version,omitempty"`

	// Decode ranks only: the group, this rank, the group size and the layers
	// this rank holds.
	GroupID   string     `msgpack:"group_id,omitempty" json:"group_id,omitempty"`
	Rank      int        `msgpack:"rank,omitempty" json:"rank,omitempty"`
	GroupSize int        `msgpack:"group_size,omitempty" json:"group_size,omitempty"`
	Layers    LayerRange `msgpack:"layers,omitempty" json:"layers,omitzero"`
	// TensorRank and TensorRanks place a decode rank in its pipeline
	// stage: the stage's layers are split over TensorRanks ranks
	// (rank = stage·TensorRanks + TensorRank), and this one holds its
	// tensor rank's slice of each. Zero: the layers unsplit.
	TensorRank  int `msgpack:"tensor_rank,omitempty" json:"tensor_rank,omitempty"`
	TensorRanks int `msgpack:"tensor_ranks,omitempty" json:"tensor_ranks,omitempty"`

	MemoryTotal uint64 `msgpack:"memory_total" json:"memory_total"` // bytes
	MemoryFree  uint64 `msgpack:"memory_free" json:"memory_free"`   // bytes
	// MaxSeqTokens is the longest sequence this worker can take now; a
	// decode rank's is what its free KV memory holds.
	MaxSeqTokens int `msgpack:"max_seq_tokens,omitempty" json:"max_seq_tokens,omitempty"`
	QueueDepth   int `msgpack:"queue_depth" json:"queue_depth"` // jobs waiting
	// PrefillChunk is a decode group's prompt rows per prefill step. The
	// group serves queued prompts in turn, a chunk each, and the router
	// prices that; 0 means whole prompts in arrival order.
	PrefillChunk int `msgpack:"prefill_chunk,omitempty" json:"prefill_chunk,omitempty"`
	Active       int `msgpack:"active" json:"active"` // jobs running

	Rates     Rates     `msgpack:"rates" json:"rates"`
	Endpoints Endpoints `msgpack:"endpoints" json:"endpoints"`

	Started  time.Time `msgpack:"started" json:"started"`
	Time     time.Time `msgpack:"time" json:"time"`                             // when this heartbeat was sent
	Draining bool      `msgpack:"draining,omitempty" json:"draining,omitempty"` // takes no new jobs

	// PrefixCache is a decode rank's prefix-state cache, or a prefill
	// worker's prefix store; absent when off.
	PrefixCache *PrefixCacheInfo `msgpack:"prefix_cache,omitempty" json:"prefix_cache,omitempty"`
}

// MaxCachedPrefixes bounds the prefixes a heartbeat advertises.
const MaxCachedPrefixes = 1024

// PrefixCacheInfo is a decode rank's prefix-state cache or a prefill
// worker's prefix store: what it holds of its memory or disk, and counters
// of what it did since the worker started. The group's head, which makes
// the group's cache decisions, and the prefill worker also list the
// prefixes a prompt can resume from, each a link of the hash chain of
// internal/prefixkey seeded with Salt and the prompt tokens it covers.
type PrefixCacheInfo struct {
	Entries   int    `msgpack:"entries" json:"entries"`
	Bytes     uint64 `msgpack:"bytes" json:"bytes"`
	Lookups   uint64 `msgpack:"lookups,omitempty" json:"lookups,omitempty"`
	Hits      uint64 `msgpack:"hits,omitempty" json:"hits,omitempty"`
	HitTokens uint64 `msgpack:"hit_tokens,omitempty" json:"hit_tokens,omitempty"`
	Misses    uint64 `msgpack:"misses,omitempty" json:"misses,omitempty"`
	Evictions uint64 `msgpack:"evictions,omitempty" json:"evictions,omitempty"`
	Salt      uint64 `msgpack:"salt,omitempty" json:"salt,omitempty"`
	// Prefixes are at most MaxCachedPrefixes, the most recently used first.
	Prefixes []CachedPrefix `msgpack:"prefixes,omitempty" json:"prefixes,omitempty"`
	// Stride is a group head's snapshot stride in tokens. A local prompt's
	// prefill steps end at each multiple of it and at the last multiple of
	// 64 before the prompt's end, as prefixkey.Snapshots says, and the
	// router prices those steps; 0 means at that end only.
	Stride int `msgpack:"stride,omitempty" json:"stride,omitempty"`
}

// CachedPrefix is one resumable prefix: its chain link and its length.
type CachedPrefix struct {
	Link   uint64 `msgpack:"link" json:"link"`
	Tokens int    `msgpack:"tokens" json:"tokens"`
}

func (c *PrefixCacheInfo) validate(msg, field string) error {
	switch {
	case c.Entries < 0:
		return fieldErr(msg, field+".entries", "is %d, must be >= 0", c.Entries)
	case c.Stride < 0 || c.Stride%64 != 0:
		return fieldErr(msg, field+".stride", "is %d, want 0 or a positive multiple of 64", c.Stride)
	case len(c.Prefixes) > MaxCachedPrefixes:
		return fieldErr(msg, field+".prefixes", "holds %d, at most %d allowed", len(c.Prefixes), MaxCachedPrefixes)
	}
	for i, p := range c.Prefixes {
		if p.Tokens <= 0 || p.Tokens%64 != 0 {
			return fieldErr(msg, fmt.Sprintf("%s.prefixes[%d].tokens", field, i), "is %d, want a positive multiple of 64", p.Tokens)
		}
	}
	return nil
}

// Validate checks the worker description.
func (w *WorkerInfo) Validate() error {
	const msg = "WorkerInfo"
	if err := CheckID(w.ID); err != nil {
		return fieldErr(msg, "id", "%v", err)
	}
	if w.Backend == "" || len(w.Backend) > 32 {
		return fieldErr(msg, "backend", "must be 1 to 32 bytes (cpu, cuda, metal)")
	}
	switch w.Kind {
	case KindPrefill:
		if w.GroupID != "" || w.GroupSize != 0 || w.Rank != 0 || w.TensorRank != 0 || w.TensorRanks != 0 {
			return fieldErr(msg, "group_id", "a prefill worker belongs to no decode group")
		}
	case KindDecode:
		if err := CheckID(w.GroupID); err != nil {
			return fieldErr(msg, "group_id", "%v", err)
		}
		if w.GroupSize <= 0 || w.Rank < 0 || w.Rank >= w.GroupSize {
			return fieldErr(msg, "rank", "is %d in a group of %d, want 0 <= rank < group_size", w.Rank, w.GroupSize)
		}
		if err := w.Layers.validate(msg, "layers"); err != nil {
			return err
		}
		if err := checkTensor(msg, "", w.Rank, w.TensorRank, w.TensorRanks); err != nil {
			return err
		}
		if T := max(w.TensorRanks, 1); w.GroupSize%T != 0 {
			return fieldErr(msg, "tensor_ranks", "is %d, which does not divide group_size %d (the group is pipeline x tensor ranks)", w.TensorRanks, w.GroupSize)
		}
	default:
		return fieldErr(msg, "kind", "is %q, must be prefill or decode", w.Kind)
	}
	switch {
	case w.MemoryFree > w.MemoryTotal:
		return fieldErr(msg, "memory_free", "is %d, more than memory_total %d", w.MemoryFree, w.MemoryTotal)
	case w.MaxSeqTokens < 0:
		return fieldErr(msg, "max_seq_tokens", "is %d, must be >= 0", w.MaxSeqTokens)
	case w.PrefillChunk < 0:
		return fieldErr(msg, "prefill_chunk", "is %d, must be >= 0 (0: whole prompts)", w.PrefillChunk)
	case w.QueueDepth < 0 || w.Active < 0:
		return fieldErr(msg, "queue_depth", "queue_depth %d and active %d must be >= 0", w.QueueDepth, w.Active)
	case w.Time.IsZero():
		return fieldErr(msg, "time", "is missing")
	}
	if err := w.Rates.validate(msg, "rates"); err != nil {
		return err
	}
	if w.PrefixCache != nil {
		if err := w.PrefixCache.validate(msg, "prefix_cache"); err != nil {
			return err
		}
	}
	return w.Endpoints.validate(msg, "endpoints")
}
