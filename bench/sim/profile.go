package sim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/config"
)

// Profile is a hardware profile (configs/hardware/*.yaml): any of a prefill
// box, a decode group and a link. A setup takes its prefill box, decode
// group and link from one profile each (or all from one, as the calibrated
// profile of this machine).
type Profile struct {
	Name        string       `yaml:"name"`
	Description string       `yaml:"description"`
	Prefill     *PrefillBox  `yaml:"prefill"`
	Decode      *DecodeGroup `yaml:"decode"`
	Link        *Link        `yaml:"link"`
	// ControlPlane is the control plane's own latency on a job's path
	// (optional; none when absent).
	ControlPlane *ControlPlane `yaml:"control_plane,omitempty"`
	// Measured records how a calibrated profile was measured (free text,
	// written by bench calibrate).
	Measured map[string]string `yaml:"measured,omitempty"`
}

// Compute is an effective compute rate per layer type, in GFLOP/s, the
// cost model's terms (costmodel.Compute): KDA and MLA are the attention
// sublayers (MLAAttention, if set, the MLA layers' causal attention over
// the cache apart from their projections), MoE and Dense the feed-forward
// ones. A profile gives the fixed cost per layer apart (layer_overhead_ms).
type Compute = costmodel.Compute

// PrefillBox is the machine that prefills by streaming the weights.
type PrefillBox struct {
	// DiskReadGBps is the sequential read rate of the shard files (GB/s,
	// 1e9 bytes/s); HostToDeviceGBps the upload rate to the accelerator (0
	// when the CPU computes in place). A layer arrives at the slower one.
	DiskReadGBps     float64 `yaml:"disk_read_gb_per_s"`
	HostToDeviceGBps float64 `yaml:"host_to_device_gb_per_s"`
	// ReadLatencyMS is the fixed cost of starting one layer's read.
	ReadLatencyMS float64 `yaml:"read_latency_ms"`
	Compute       Compute `yaml:"compute_gflops"`
	// LayerOverheadMS is a fixed compute cost per layer per pass.
	LayerOverheadMS float64 `yaml:"layer_overhead_ms"`
	// MemoryBudget is the planner's budget (a byte size, internal/config).
	MemoryBudget string `yaml:"memory_budget"`
	MaxDepth     int    `yaml:"max_depth"`
	MaxTile      int    `yaml:"max_tile"`
	Threads      int    `yaml:"threads"`
}

// RatePoint is a measured prefill rate: the average over a prompt of Tokens
// tokens.
type RatePoint struct {
	Tokens  int     `yaml:"tokens"`
	TokPerS float64 `yaml:"tok_per_s"`
}

// DecodeGroup is the group of ranks that holds the weights resident,
// decodes, and prefills short prompts itself.
type DecodeGroup struct {
	Ranks int `yaml:"ranks"`
	// StateMemory bounds the sequence states the group holds at once
	// (a byte size, internal/config; empty: unbounded).
	StateMemory string `yaml:"state_memory"`
	// The group's own prefill cost: either measured rates (PrefillRate), or
	// compute rates per layer type as for a prefill box (Compute and
	// LayerOverheadMS per layer per chunk).
	PrefillRate     []RatePoint `yaml:"prefill_rate"`
	Compute         *Compute    `yaml:"compute_gflops"`
	LayerOverheadMS float64     `yaml:"layer_overhead_ms"`
	// PrefillChunk is the prompt rows per local prefill step.
	PrefillChunk int `yaml:"prefill_chunk"`
	// DecodeStepMS is one batched decode step; MaxBatch the sequences one
	// step carries.
	DecodeStepMS float64 `yaml:"decode_step_ms"`
	MaxBatch     int     `yaml:"max_batch"`
}

// Link is the data plane between the prefill box and the decode group.
type Link struct {
	GBps  float64 `yaml:"gb_per_s"`
	RTTUS float64 `yaml:"rtt_us"`
	// PerRank gives each decode rank a link of its own at GBps (as with a
	// rate limit on each rank's connection); by default every rank shares
	// one (the prefill box's network interface).
	PerRank bool `yaml:"per_rank,omitempty"`
}

// ControlPlane is what the control plane adds to a job's time to first
// token beyond the work itself, on each path: the submission and its queue,
// routing, the assignments (the decode group's admission, and for a remote
// job the prefill worker's), the workers' reports and the token's way to
// the client. Milliseconds on a machine or a LAN, it matters only for
// short jobs on small models.
type ControlPlane struct {
	LocalMS  float64 `yaml:"local_ms"`
	RemoteMS float64 `yaml:"remote_ms"`
}

func (c *ControlPlane) validate() error {
	if err := nonNegativeField("local_ms", c.LocalMS); err != nil {
		return err
	}
	return nonNegativeField("remote_ms", c.RemoteMS)
}

// ParseProfile reads a profile; name is used in errors. Unknown keys are
// errors, so that a misspelt key is not silently ignored.
func ParseProfile(b []byte, name string) (*Profile, error) {
	var p Profile
	if err := config.DecodeYAML("hardware profile "+name, b, &p); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("hardware profile %s: empty", name)
		}
		return nil, err
	}
	if p.Name == "" {
		p.Name = name
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("hardware profile %s: %w", name, err)
	}
	return &p, nil
}

// LoadProfile reads a profile by name from configs/hardware, or from a file
// when ref names one (contains a path separator or ends in .yaml).
func LoadProfile(ref string) (*Profile, error) {
	if strings.ContainsRune(ref, os.PathSeparator) || strings.Contains(ref, "/") || strings.HasSuffix(ref, ".yaml") || strings.HasSuffix(ref, ".yml") {
		b, err := os.ReadFile(ref)
		if err != nil {
			return nil, fmt.Errorf("hardware profile: %w", err)
		}
		return ParseProfile(b, ref)
	}
	b, err := configs.HardwareProfile(ref)
	if err != nil {
		return nil, err
	}
	return ParseProfile(b, ref)
}

// Validate checks every section present; a profile must have at least one.
func (p *Profile) Validate() error {
	if p.Prefill == nil && p.Decode == nil && p.Link == nil {
		return errors.New("no prefill, decode or link section")
	}
	if p.ControlPlane != nil {
		if err := p.ControlPlane.validate(); err != nil {
			return fmt.Errorf("control_plane: %w", err)
		}
	}
	if p.Prefill != nil {
		if err := p.Prefill.validate(); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	if p.Decode != nil {
		if err := p.Decode.validate(); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
	}
	if p.Link != nil {
		if err := p.Link.validate(); err != nil {
			return fmt.Errorf("link: %w", err)
		}
	}
	return nil
}

func positiveField(key string, v float64) error {
	if !(v > 0) || math.IsInf(v, 0) {
		return fmt.Errorf("%s is %v, want a positive number", key, v)
	}
	return nil
}

func nonNegativeField(key string, v float64) error {
	if !(v >= 0) || math.IsInf(v, 0) {
		return fmt.Errorf("%s is %v, want zero or more", key, v)
	}
	return nil
}

func validateCompute(c Compute, key string) error {
	for _, f := range []struct {
		k string
		v float64
	}{{"kda", c.KDA}, {"mla", c.MLA}, {"moe", c.MoE}, {"dense", c.Dense}} {
		if err := positiveField(key+"."+f.k, f.v); err != nil {
			return err
		}
	}
	return nonNegativeField(key+".mla_attention", c.MLAAttention)
}

func (b *PrefillBox) validate() error {
	if err := positiveField("disk_read_gb_per_s", b.DiskReadGBps); err != nil {
		return err
	}
	for _, f := range []struct {
		k string
		v float64
	}{{"host_to_device_gb_per_s", b.HostToDeviceGBps}, {"read_latency_ms", b.ReadLatencyMS}, {"layer_overhead_ms", b.LayerOverheadMS}} {
		if err := nonNegativeField(f.k, f.v); err != nil {
			return err
		}
	}
	if err := validateCompute(b.Compute, "compute_gflops"); err != nil {
		return err
	}
	if _, err := b.Budget(); err != nil {
		return err
	}
	if b.MaxDepth < 0 || b.MaxTile < 0 || b.Threads < 0 {
		return fmt.Errorf("max_depth %d, max_tile %d, threads %d: none may be negative", b.MaxDepth, b.MaxTile, b.Threads)
	}
	return nil
}

// Budget is the planner's memory budget in bytes.
func (b *PrefillBox) Budget() (int64, error) {
	if b.MemoryBudget == "" {
		return 0, errors.New("memory_budget is missing")
	}
	n, err := config.ParseBytes(b.MemoryBudget)
	if err != nil {
		return 0, fmt.Errorf("memory_budget: %w", err)
	}
	if n <= 0 {
		return 0, fmt.Errorf("memory_budget %q is not positive", b.MemoryBudget)
	}
	return n, nil
}

// ReadBytesPerS is the rate at which a layer's weights arrive where they are
// computed.
func (b *PrefillBox) ReadBytesPerS() float64 {
	r := b.DiskReadGBps
	if b.HostToDeviceGBps > 0 {
		r = min(r, b.HostToDeviceGBps)
	}
	return r * 1e9
}

func (g *DecodeGroup) validate() error {
	if g.Ranks < 1 {
		return fmt.Errorf("ranks is %d, want at least 1", g.Ranks)
	}
	if g.StateMemory != "" {
		if _, err := config.ParseBytes(g.StateMemory); err != nil {
			return fmt.Errorf("state_memory: %w", err)
		}
	}
	switch {
	case len(g.PrefillRate) > 0 && g.Compute != nil:
		return errors.New("give either prefill_rate or compute_gflops, not both")
	case len(g.PrefillRate) == 0 && g.Compute == nil:
		return errors.New("prefill_rate or compute_gflops is missing: the group's own prefill cost")
	case g.Compute != nil:
		if err := validateCompute(*g.Compute, "compute_gflops"); err != nil {
			return err
		}
	}
	for i, p := range g.PrefillRate {
		if p.Tokens < 1 {
			return fmt.Errorf("prefill_rate[%d].tokens is %d, want at least 1", i, p.Tokens)
		}
		if err := positiveField(fmt.Sprintf("prefill_rate[%d].tok_per_s", i), p.TokPerS); err != nil {
			return err
		}
	}
	if err := nonNegativeField("layer_overhead_ms", g.LayerOverheadMS); err != nil {
		return err
	}
	if g.PrefillChunk < 0 || g.MaxBatch < 0 {
		return fmt.Errorf("prefill_chunk %d and max_batch %d may not be negative", g.PrefillChunk, g.MaxBatch)
	}
	return positiveField("decode_step_ms", g.DecodeStepMS)
}

// StateBytes is the group's state memory in bytes (0: unbounded).
func (g *DecodeGroup) StateBytes() int64 {
	if g.StateMemory == "" {
		return 0
	}
	n, _ := config.ParseBytes(g.StateMemory)
	return n
}

func (l *Link) validate() error {
	if err := positiveField("gb_per_s", l.GBps); err != nil {
		return err
	}
	return nonNegativeField("rtt_us", l.RTTUS)
}
