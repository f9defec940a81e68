package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/health"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/model"
)

// process names the worker's environment variables:
// TANDEM_DECODE_WORKER_RANK, TANDEM_DECODE_WORKER_MESH_IDLE, ...
const process = "decode-worker"

// settings are every configuration key with its default: a flag (dots and
// underscores as dashes), an environment variable and a --config file key.
// opsSettings are the rank's operations: /metrics, /healthz and /readyz,
// and (control-plane mode) how long a drain and the leaving after it may
// take.
var opsSettings = append(health.Settings("127.0.0.1:0"),
	config.Setting{Key: "drain.grace", Default: 5 * time.Minute, Help: "control-plane mode: on SIGTERM or `coordinator drain`, how long the sequences the rank holds may finish (no new ones are taken) before the rest are cancelled"},
	config.Setting{Key: "shutdown.grace", Default: 10 * time.Second, Help: "control-plane mode: how long leaving may take after the drain (cancelling, deregistering, closing connections), whether or not NATS is still there"})

var settings = []config.Setting{
	{Key: "rank", Default: 0, Help: "this worker's rank in the decode group"},
	{Key: "group_config", Default: "", Help: "the decode group's file: group, secret or secret_file, tensor, ranks (endpoint, layers, memory_budget) (required)"},
	{Key: "model", Default: "", Help: "checkpoint directory: config.json + safetensors shards (required)"},
	{Key: "listen", Default: "", Help: "listen address (default: the rank's endpoint)"},
	{Key: "threads", Default: 0, Help: "CPU threads for compute (0: every core)"},
	{Key: "backend", Default: "cpu", Help: "compute backend: cpu, metal (the Mac's GPU; not yet run on a Mac, see kernels/metal) or auto (metal on Apple Silicon when it opens, else cpu)"},
	{Key: "memory_budget", Bytes: true, Default: "0", Help: "sequence state memory budget, a byte size: 64GiB (0: the group file's, else unlimited)"},
	{Key: "micro_batches", Default: 0, Help: "steps in flight (0: the number of pipeline stages)"},
	{Key: "max_batch", Default: 64, Help: "sequences per decode step"},
	{Key: "prefill_chunk", Default: 512, Help: "prompt rows per prefill step, a multiple of 64 (negative: whole prompts)"},
	{Key: "cache_dtype", Default: "bf16", Help: "MLA latent cache dtype: bf16 (the state contract) or f32"},
	// The prefix-state cache: finished prompts' states kept in the memory
	// budget for prompts that start the same (every rank of a group alike).
	{Key: "prefix_cache.enabled", Default: true, Help: "keep finished prompts' states for prompts that start the same (every rank of a group alike)"},
	{Key: "prefix_cache.stride", Default: 0, Help: "also snapshot the KDA states every this many prefilled tokens (a multiple of 64; 0: at prompt ends only)"},
	// Speculative decoding: rank 0 drafts, every rank verifies.
	{Key: "draft.mode", Default: "lookup", Help: "speculative decoding on rank 0: lookup (draft from each sequence's prompt and output and from earlier sequences, where the measured step cost says it pays; exact either way) or off"},
	{Key: "draft.max", Default: 4, Help: "most tokens drafted for a sequence per step (1 to 16)"},
	{Key: "latent_norm_eps", Default: 0.0, Help: "override the MLA latent norm eps (0: the config's)"},
	{Key: "step_timeout", Default: 5 * time.Minute, Help: "a step not back by then resets the group"},
	{Key: "mesh.heartbeat", Default: 500 * time.Millisecond, Help: "mesh keep-alive period"},
	{Key: "mesh.idle", Default: 3 * time.Second, Help: "silence that kills a mesh link"},
	{Key: "transfer.handshake", Default: 5 * time.Second, Help: "state transfer: bound on a connection's handshake"},
	{Key: "transfer.io", Default: 15 * time.Second, Help: "state transfer: bound on one read or write"},
	{Key: "transfer.idle", Default: 15 * time.Second, Help: "state transfer: a session silent this long fails"},
	{Key: "transfer.keep_alive", Default: 2 * time.Second, Help: "state transfer: keep-alive interval"},
	{Key: "frontdoor", Default: true, Help: "rank 0 serves the front door's client protocol"},
	// Over RDMA a rank takes link bootstraps on its endpoint's port + 1 and
	// the prefill worker's TCP on the endpoint.
	{Key: "transport", Default: "tcp", Help: "the mesh between ranks: tcp, rdma (Thunderbolt 5 RDMA; fail without it) or auto (RDMA where a device has the endpoint's address, else TCP, logged)"},
	{Key: "rdma.device", Default: "", Help: "the RDMA device, e.g. rdma_en3 (default: the device with the endpoint's IP as a GID)"},
	{Key: "rdma.slot_size", Bytes: true, Default: "128KiB", Help: "RDMA slot size, a byte size (every rank alike)"},
	{Key: "rdma.slots", Default: 16, Help: "RDMA slots per ring (every rank alike)"},
	// Control-plane mode (with nats.url): the rank registers in the worker
	// registry and rank 0 takes the coordinator's jobs.
	{Key: "worker_id", Default: "", Help: "control-plane mode: this rank's worker id (default <group>-r<rank>)"},
	{Key: "advertise", Default: "", Help: "control-plane mode: host:port other workers reach this rank on (default: its endpoint in the group file)"},
	{Key: "registry.ttl", Default: 10 * time.Second, Help: "control-plane mode: the worker registry's TTL when this worker creates it (a server without tandem identities); with an identity the bucket's own"},
	{Key: "registry.memory", Default: false, Help: "control-plane mode: keep the registry this worker creates in memory"},
	{Key: "registry.heartbeat", Default: time.Duration(0), Help: "control-plane mode: heartbeat interval (0: a third of registry.ttl)"},
}

// help is the worker's --help text above its flags.
var help = `One rank of a decode group: it keeps its layer range's weights resident,
receives remote-prefilled state for its layers, and decodes in a pipeline
with the other ranks over the mesh. Rank 0 takes sequences (from the
coordinator with --nats-url, or from clients of its front door) and hands
out their tokens.

  decode-worker --rank R --group-config FILE --model DIR [--nats-url URL]
  decode-worker rdma-probe [--listen ADDR | --peer ADDR]
  decode-worker rdma-probe --group-config FILE --rank R [--answer | --measure]

Every rank of a group reads the same group file (group.example.yaml): the
group's name, its mesh secret (secret, or secret_file relative to the file,
or $TANDEM_GROUP_SECRET), and its ranks, each with endpoint, and optionally
layers [lo, hi) (on every rank or none) and memory_budget (a byte size).
The layout is pipeline stages x tensor ranks per stage (key tensor, default
1): the ranks number pipeline x tensor and are listed stage-major, rank =
stage*tensor + t (with tensor 2, ranks 0 and 1 are stage 0, ranks 2 and 3
stage 1). Each stage owns a contiguous range of layers, the same on all of
its ranks; the first stage's ranks also hold the embedding, the last stage's
the final norm and the lm_head (every one of them draws the tokens alike;
the group's last rank sends them to rank 0).
With tensor > 1 each rank of a stage holds 1/tensor of each of the stage's
layers: its range of the KDA and MLA heads (and their share of the
sequence state), of the routed experts (by id), of the shared expert's and
the dense FFN's width, and of the lm_head's vocabulary; norms, routers and
the MLA latent cache are whole on every rank. After each attention and MLP
block a stage's ranks sum their partial outputs (an all-reduce), so besides
the pipeline ring (rank r to r+1, the last rank back to 0) every rank must
reach its stage's other ranks (a link between each pair up to 4 ranks, a
ring among them above). tensor must divide the model's KDA heads and its
MLA heads (96 and 96 in K3: 2, 3, 4, 6, 8 ...) and be at most its routed
experts. rdma-probe --group-config FILE --rank R lists the links a rank
uses and measures them.

` + config.Help(process)

// workerConfig is the decode worker's resolved configuration.
type workerConfig struct {
	Rank         int
	GroupConfig  string
	Model        string
	Listen       string
	Threads      int
	Backend      string // cpu, metal or auto
	MemoryBudget int64
	MicroBatches int
	MaxBatch     int
	PrefillChunk int
	CacheDType   model.DType
	PrefixCache  bool
	PrefixStride int
	Draft        bool // draft.mode is lookup
	DraftMax     int
	LatentEps    float64
	StepTimeout  time.Duration
	Heartbeat    time.Duration
	Idle         time.Duration
	Handshake    time.Duration
	IO           time.Duration
	TransferIdle time.Duration
	KeepAlive    time.Duration
	Frontdoor    bool
	Transport    string
	RDMA         rdma.Config // Device, SlotSize, Slots
	LogLevel     string
	LogFormat    string
	// Control-plane mode: NATS.URL set.
	NATS      controlplane.Options
	WorkerID  string
	Advertise string
	Registry  controlplane.RegistryConfig
	Beat      time.Duration // registry heartbeat interval
	// Operations.
	Metrics       health.Options
	DrainGrace    time.Duration // held sequences may finish this long on SIGTERM or a drain request
	ShutdownGrace time.Duration // leaving after that (cancelling, deregistering) takes at most this long
}

// command is the worker's command line: run gets the resolved
// configuration; rdma-probe is a subcommand.
func command(stdout, stderr io.Writer, run func(*cobra.Command, *workerConfig) error) *cobra.Command {
	cmd := config.WorkerCommand("decode-worker --rank R --group-config FILE --model DIR [flags]", "one rank of a decode group", help, stdout, stderr, resolveConfig, run,
		settings, opsSettings, controlplane.ClientSettings, config.LogSettings)
	cmd.AddCommand(&cobra.Command{
		Use:                "rdma-probe [--listen ADDR | --peer ADDR | --group-config FILE --rank R [--answer | --measure]]",
		Short:              "report this machine's RDMA environment and measure its RDMA links to other ranks",
		DisableFlagParsing: true, // rdmaProbe parses its own, --help included
		RunE: func(cmd *cobra.Command, args []string) error {
			return rdmaProbe(cmd.Context(), args, stdout)
		},
	})
	return cmd
}

// loadConfig resolves the configuration from args alone (tests).
func loadConfig(args []string) (*workerConfig, error) {
	var cfg *workerConfig
	cmd := command(io.Discard, io.Discard, func(_ *cobra.Command, c *workerConfig) error { cfg = c; return nil })
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// resolveConfig resolves the configuration from the parsed flags, the
// environment and the optional --config file.
func resolveConfig(fs *pflag.FlagSet, args []string) (*workerConfig, error) {
	if len(args) > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", args)
	}
	file, _ := fs.GetString("config")
	v, err := config.Load(fs, process, file, settings, opsSettings, controlplane.ClientSettings, config.LogSettings)
	if err != nil {
		return nil, err
	}
	c := &workerConfig{Rank: v.GetInt("rank"), GroupConfig: v.GetString("group_config"), Model: v.GetString("model"),
		Listen: v.GetString("listen"), Threads: v.GetInt("threads"), Backend: v.GetString("backend"), MicroBatches: v.GetInt("micro_batches"),
		MaxBatch: v.GetInt("max_batch"), PrefillChunk: v.GetInt("prefill_chunk"), LatentEps: v.GetFloat64("latent_norm_eps"),
		PrefixCache: v.GetBool("prefix_cache.enabled"), PrefixStride: v.GetInt("prefix_cache.stride"),
		DraftMax: v.GetInt("draft.max"), StepTimeout: v.GetDuration("step_timeout"), Heartbeat: v.GetDuration("mesh.heartbeat"), Idle: v.GetDuration("mesh.idle"),
		Handshake: v.GetDuration("transfer.handshake"), IO: v.GetDuration("transfer.io"),
		TransferIdle: v.GetDuration("transfer.idle"), KeepAlive: v.GetDuration("transfer.keep_alive"),
		Frontdoor: v.GetBool("frontdoor"), Transport: v.GetString("transport"),
		RDMA:     rdma.Config{Device: v.GetString("rdma.device"), Slots: v.GetInt("rdma.slots")},
		LogLevel: v.GetString("log.level"), LogFormat: v.GetString("log.format"),
		WorkerID: v.GetString("worker_id"), Advertise: v.GetString("advertise"), Beat: v.GetDuration("registry.heartbeat"),
		Registry:   controlplane.RegistryConfig{TTL: v.GetDuration("registry.ttl"), Memory: v.GetBool("registry.memory")},
		NATS:       controlplane.OptionsFromSettings(v.GetString, v.GetDuration),
		DrainGrace: v.GetDuration("drain.grace"), ShutdownGrace: v.GetDuration("shutdown.grace")}
	if c.Metrics, err = health.OptionsFrom(v.GetString, v.GetBool); err != nil {
		return nil, err
	}
	c.NATS.MaxReconnects = -1 // a worker keeps trying for as long as it runs
	if c.MemoryBudget, err = config.ParseBytes(v.GetString("memory_budget")); err != nil {
		return nil, fmt.Errorf("memory_budget: %w", err)
	}
	slot, err := config.ParseBytes(v.GetString("rdma.slot_size"))
	if err != nil {
		return nil, fmt.Errorf("rdma.slot_size: %w", err)
	}
	if slot > 1<<30 {
		return nil, fmt.Errorf("rdma.slot_size %d: at most 1GiB", slot)
	}
	c.RDMA.SlotSize = int(slot)
	if c.CacheDType, err = model.ParseCacheDType(v.GetString("cache_dtype")); err != nil {
		return nil, fmt.Errorf("cache_dtype: %w", err)
	}
	switch c.Backend {
	case "cpu", "metal", "auto":
	default:
		return nil, fmt.Errorf("backend %q: want cpu, metal or auto", c.Backend)
	}
	switch c.Transport {
	case "tcp", "rdma", "auto":
	default:
		return nil, fmt.Errorf("transport %q: want tcp, rdma or auto", c.Transport)
	}
	switch mode := v.GetString("draft.mode"); mode {
	case "lookup", "off":
		c.Draft = mode == "lookup"
	default:
		return nil, fmt.Errorf("draft.mode %q: want lookup or off", mode)
	}
	if c.DraftMax < 1 || c.DraftMax > pipeline.MaxDraft {
		return nil, fmt.Errorf("draft.max %d: want 1 to %d", c.DraftMax, pipeline.MaxDraft)
	}
	switch {
	case c.GroupConfig == "":
		return nil, errors.New("--group-config is required")
	case c.Model == "":
		return nil, errors.New("--model is required")
	case c.Rank < 0:
		return nil, fmt.Errorf("--rank %d is negative", c.Rank)
	case c.DrainGrace < 0 || c.ShutdownGrace <= 0:
		return nil, fmt.Errorf("drain.grace %v, shutdown.grace %v: want drain.grace >= 0 and shutdown.grace > 0", c.DrainGrace, c.ShutdownGrace)
	case c.PrefixStride < 0 || c.PrefixStride%model.KDAChunk != 0:
		return nil, fmt.Errorf("prefix_cache.stride %d: want a multiple of %d (0: snapshots at prompt ends only)", c.PrefixStride, model.KDAChunk)
	}
	return c, nil
}

// groupFile is the group config file's shape.
type groupFile struct {
	Group      string     `mapstructure:"group"`
	Secret     string     `mapstructure:"secret"`
	SecretFile string     `mapstructure:"secret_file"`
	Ranks      []rankFile `mapstructure:"ranks"`
	Tensor     int        `mapstructure:"tensor"`
}

// groupKeys and rankKeys are the group file's keys: any other is refused.
var (
	groupKeys = []string{"group", "secret", "secret_file", "ranks", "tensor"}
	rankKeys  = []string{"endpoint", "layers", "memory_budget"}
)

type rankFile struct {
	Endpoint     string `mapstructure:"endpoint"`
	Layers       []int  `mapstructure:"layers"` // [lo, hi); all ranks or none
	MemoryBudget string `mapstructure:"memory_budget"`
}

// loadGroup reads the group config file: the layout (layers split evenly
// when no rank lists them) and the mesh secret, from the file, the file
// named by secret_file, or $TANDEM_GROUP_SECRET.
func loadGroup(path string, numLayers int) (*rank.Layout, []byte, error) {
	v, err := config.ReadFile(path, groupKeys)
	if err != nil {
		return nil, nil, fmt.Errorf("group %w", err)
	}
	v.SetDefault("group", "decode")
	if ranks, ok := v.Get("ranks").([]any); ok {
		for i, r := range ranks {
			m, ok := r.(map[string]any)
			if !ok {
				return nil, nil, fmt.Errorf("group config %s: ranks[%d] is not a map of endpoint, layers and memory_budget", path, i)
			}
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			if err := config.CheckKeys(fmt.Sprintf("group config %s: ranks[%d]", path, i), keys, rankKeys); err != nil {
				return nil, nil, err
			}
		}
	}
	var gf groupFile
	if err := v.Unmarshal(&gf); err != nil {
		return nil, nil, fmt.Errorf("group config %s: %w", path, err)
	}
	secret := []byte(gf.Secret)
	if gf.SecretFile != "" {
		f := gf.SecretFile
		if !filepath.IsAbs(f) {
			f = filepath.Join(filepath.Dir(path), f)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("group config %s: secret_file: %w", path, err)
		}
		secret = []byte(strings.TrimSpace(string(b)))
	}
	if s := os.Getenv("TANDEM_GROUP_SECRET"); s != "" {
		secret = []byte(s)
	}
	if len(secret) < 16 {
		return nil, nil, fmt.Errorf("group config %s: the mesh secret has %d bytes, at least 16 needed (secret, secret_file or $TANDEM_GROUP_SECRET)", path, len(secret))
	}
	if len(gf.Ranks) == 0 {
		return nil, nil, fmt.Errorf("group config %s: no ranks", path)
	}
	eps := make([]string, len(gf.Ranks))
	listed := 0
	for i, r := range gf.Ranks {
		eps[i] = r.Endpoint
		if len(r.Layers) > 0 {
			listed++
		}
	}
	if gf.Tensor < 0 {
		return nil, nil, fmt.Errorf("group config %s: tensor %d: want 1 or more ranks per stage", path, gf.Tensor)
	}
	l, err := rank.EvenTensor(gf.Group, numLayers, eps, max(gf.Tensor, 1))
	if err != nil {
		return nil, nil, fmt.Errorf("group config %s: %w", path, err)
	}
	if listed != 0 && listed != len(gf.Ranks) {
		return nil, nil, fmt.Errorf("group config %s: %d of %d ranks list their layers; list them on all or none", path, listed, len(gf.Ranks))
	}
	for i, r := range gf.Ranks {
		if listed > 0 {
			if len(r.Layers) != 2 {
				return nil, nil, fmt.Errorf("group config %s: rank %d layers %v: want [lo, hi)", path, i, r.Layers)
			}
			l.Ranks[i].Lo, l.Ranks[i].Hi = r.Layers[0], r.Layers[1]
		}
		if r.MemoryBudget == "" {
			continue // unlimited
		}
		if l.Ranks[i].MemoryBudget, err = config.ParseBytes(r.MemoryBudget); err != nil {
			return nil, nil, fmt.Errorf("group config %s: rank %d memory_budget: %w", path, i, err)
		}
	}
	if err := l.Validate(numLayers); err != nil {
		return nil, nil, fmt.Errorf("group config %s: %w", path, err)
	}
	return l, secret, nil
}
