package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/health"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

// process names the worker's environment variables:
// TANDEM_PREFILL_WORKER_MEMORY_BUDGET, TANDEM_PREFILL_WORKER_NATS_URL, ...
const process = "prefill-worker"

// settings are every configuration key with its default: a flag (dots and
// underscores as dashes), an environment variable and a --config file key.
var settings = []config.Setting{
	{Key: "model", Default: "", Help: "checkpoint directory: config.json + safetensors shards (required)"},
	{Key: "memory_budget", Bytes: true, Default: "8GiB", Old: "mem_budget", Help: "memory budget for the weights ring, states, activations and temporaries, a byte size: 512MiB, 24GiB"},
	{Key: "backend", Default: "cpu", Help: "compute backend: cpu, cuda (an NVIDIA GPU through the driver, libcuda.so.1) or auto (cuda if usable, else cpu)"},
	{Key: "cuda.device", Default: 0, Help: "CUDA device ordinal (backend cuda or auto)"},
	{Key: "threads", Default: 0, Help: "CPU threads for compute (0: every core)"},
	{Key: "depth", Default: -1, Help: "prefetch depth: layers read ahead of compute (-1: chosen from the budget)"},
	{Key: "cache_dtype", Default: "bf16", Help: "MLA latent cache dtype: bf16 (the state contract) or f32"},
	{Key: "latent_norm_eps", Default: 0.0, Help: "override the MLA latent norm eps (0: the config's)"},
	{Key: "io", Default: "auto", Help: "weight reads: auto (direct I/O where possible), direct (required) or buffered"},
	{Key: "read_size", Bytes: true, Default: "8MiB", Help: "bytes per read request, a byte size"},
	{Key: "readers", Default: streamer.DefaultReaders, Help: "read requests in flight"},
	{Key: "max_tile", Default: 0, Help: "most token rows per layer call (0: the planner's default)"},
	{Key: "sink.queue", Default: 4, Help: "layer states queued towards a job's sink before the pass waits for it"},
	{Key: "sink.timeout", Default: time.Minute, Help: "how long a pass waits for a job's sink before failing that job"},
	{Key: "sink.close_timeout", Default: 5 * time.Minute, Help: "how long a finished job's sink may take to close"},
	{Key: "prompt", Default: []string{}, Repeat: true, Help: "standalone mode: a prompt as comma-separated token ids (repeatable); all prompts share passes"},
	{Key: "prompts_file", Default: "", Help: "standalone mode: a file with one prompt (comma-separated token ids) per line"},
	{Key: "out", Default: "", Help: "standalone mode: directory for the states, one <job>.k3st file per prompt (SeqState encoding)"},
	{Key: "dry_run", Default: false, Help: "print the pass plans for the prompts and exit without reading weights"},
	{Key: "memory_limit", Default: true, Help: "set the Go runtime's memory limit to the budget, so the collector keeps garbage within it"},
	// Control-plane mode (with nats.url): the worker registers in the
	// worker registry and takes the coordinator's jobs, streaming each
	// job's state to its decode ranks over kvtransfer.
	{Key: "worker_id", Default: "", Help: "control-plane mode: this worker's id (default prefill-<host name>)"},
	{Key: "registry.ttl", Default: 10 * time.Second, Help: "control-plane mode: the worker registry's TTL when this worker creates it (a server without tandem identities); with an identity the bucket's own"},
	{Key: "registry.memory", Default: false, Help: "control-plane mode: keep the registry this worker creates in memory"},
	{Key: "registry.heartbeat", Default: time.Duration(0), Help: "control-plane mode: heartbeat interval (0: a third of registry.ttl)"},
	{Key: "transfer.conns", Default: 0, Help: "state transfer: connections per decode rank (0: kvtransfer's default)"},
	{Key: "transfer.handshake", Default: 5 * time.Second, Help: "state transfer: bound on a connection's handshake"},
	{Key: "transfer.io", Default: 15 * time.Second, Help: "state transfer: bound on one read or write"},
	{Key: "transfer.idle", Default: 15 * time.Second, Help: "state transfer: a session silent this long fails"},
	{Key: "transfer.keep_alive", Default: 2 * time.Second, Help: "state transfer: keep-alive interval while a layer is being computed"},
	// The prefix store: prompts' states kept on a local disk, so that a
	// session's next turn prefills only its new tokens.
	{Key: "prefix_store.dir", Default: "", Help: "control-plane mode: directory of the prefix store (a local NVMe disk), where prompts' states are kept for their session's next turn; off when empty"},
	{Key: "prefix_store.max_bytes", Bytes: true, Default: "64GiB", Help: "control-plane mode: the prefix store's size bound, a byte size (the least recently used entries go first)"},
}

// opsSettings are the control-plane mode's operations: /metrics, /healthz
// and /readyz, and how long a drain and the leaving after it may take.
var opsSettings = append(health.Settings("127.0.0.1:0"),
	config.Setting{Key: "drain.grace", Default: 5 * time.Minute, Help: "control-plane mode: on SIGTERM or `coordinator drain`, how long running jobs may finish (no new ones are taken) before the rest are cancelled"},
	config.Setting{Key: "shutdown.grace", Default: 10 * time.Second, Help: "control-plane mode: how long leaving may take after the drain (cancelling jobs, deregistering, closing connections), whether or not NATS is still there"})

// help is the worker's --help text above its flags.
var help = `Layer-streamed prefill of Kimi K3 under a memory budget: the worker reads
each layer's weights from disk into a ring, applies the layer to every prompt
of the current pass, and hands each layer's state on as soon as it is done.

Standalone mode (debugging, benchmarks) prefills prompts from the command
line and writes each one's state to a file:

  prefill-worker --model DIR --memory-budget 4GiB --prompt 1,2,3 --prompt 4,5 --out STATES
  prefill-worker --model DIR --memory-budget 512MiB --prompts-file P --dry-run

Control-plane mode takes the coordinator's jobs and streams each job's state
to its decode ranks:

  prefill-worker --model DIR --memory-budget 24GiB --nats-url nats://coordinator:4222

` + config.Help(process)

// workerConfig is the prefill worker's resolved configuration.
type workerConfig struct {
	Model        string
	Budget       int64
	Backend      string
	CUDADevice   int
	Threads      int
	Depth        int
	CacheDType   model.DType
	LatentEps    float64
	IO           streamer.IOMode
	ReadSize     int64
	Readers      int
	MaxTile      int
	SinkQueue    int
	SinkTimeout  time.Duration
	CloseTimeout time.Duration
	Prompts      [][]int32
	Out          string
	DryRun       bool
	MemoryLimit  bool
	LogLevel     string
	LogFormat    string
	// Control-plane mode: NATS.URL set.
	NATS          controlplane.Options
	WorkerID      string
	Registry      controlplane.RegistryConfig
	Beat          time.Duration // registry heartbeat interval
	Transfer      kvtransfer.Timeouts
	TransferConns int
	StoreDir      string // prefix store directory ("": off)
	StoreBytes    int64
	// Operations.
	Metrics       health.Options
	DrainGrace    time.Duration // running jobs may finish this long on SIGTERM or a drain request
	ShutdownGrace time.Duration // leaving after that (cancelling, deregistering) takes at most this long
}

// command is the worker's command line: run gets the resolved
// configuration.
func command(stdout, stderr io.Writer, run func(*cobra.Command, *workerConfig) error) *cobra.Command {
	cmd := config.WorkerCommand("prefill-worker --model DIR [flags]", "layer-streamed prefill of Kimi K3 under a memory budget", help, stdout, stderr, resolveConfig, run,
		settings, opsSettings, controlplane.ClientSettings, config.LogSettings)
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
	c := &workerConfig{Model: v.GetString("model"), Backend: v.GetString("backend"), CUDADevice: v.GetInt("cuda.device"), Threads: v.GetInt("threads"),
		Depth: v.GetInt("depth"), LatentEps: v.GetFloat64("latent_norm_eps"), Readers: v.GetInt("readers"),
		MaxTile: v.GetInt("max_tile"), SinkQueue: v.GetInt("sink.queue"), SinkTimeout: v.GetDuration("sink.timeout"),
		CloseTimeout: v.GetDuration("sink.close_timeout"), Out: v.GetString("out"), DryRun: v.GetBool("dry_run"),
		MemoryLimit: v.GetBool("memory_limit"), LogLevel: v.GetString("log.level"), LogFormat: v.GetString("log.format"),
		WorkerID: v.GetString("worker_id"), Beat: v.GetDuration("registry.heartbeat"), TransferConns: v.GetInt("transfer.conns"),
		Registry: controlplane.RegistryConfig{TTL: v.GetDuration("registry.ttl"), Memory: v.GetBool("registry.memory")},
		Transfer: kvtransfer.Timeouts{Handshake: v.GetDuration("transfer.handshake"), IO: v.GetDuration("transfer.io"),
			Idle: v.GetDuration("transfer.idle"), KeepAlive: v.GetDuration("transfer.keep_alive")},
		NATS:       controlplane.OptionsFromSettings(v.GetString, v.GetDuration),
		DrainGrace: v.GetDuration("drain.grace"), ShutdownGrace: v.GetDuration("shutdown.grace"),
		StoreDir: v.GetString("prefix_store.dir")}
	c.NATS.MaxReconnects = -1 // a worker keeps trying for as long as it runs
	if c.Metrics, err = health.OptionsFrom(v.GetString, v.GetBool); err != nil {
		return nil, err
	}
	if c.Budget, err = config.ParseBytes(v.GetString("memory_budget")); err != nil {
		return nil, fmt.Errorf("memory_budget: %w", err)
	}
	if c.ReadSize, err = config.ParseBytes(v.GetString("read_size")); err != nil {
		return nil, fmt.Errorf("read_size: %w", err)
	}
	if c.StoreBytes, err = config.ParseBytes(v.GetString("prefix_store.max_bytes")); err != nil {
		return nil, fmt.Errorf("prefix_store.max_bytes: %w", err)
	}
	if c.IO, err = streamer.ParseIOMode(v.GetString("io")); err != nil {
		return nil, fmt.Errorf("io: %w", err)
	}
	if c.CacheDType, err = model.ParseCacheDType(v.GetString("cache_dtype")); err != nil {
		return nil, fmt.Errorf("cache_dtype: %w", err)
	}
	for i, p := range v.GetStringSlice("prompt") {
		ids, err := parseIDs(p)
		if err != nil {
			return nil, fmt.Errorf("prompt %d: %w", i+1, err)
		}
		c.Prompts = append(c.Prompts, ids)
	}
	if f := v.GetString("prompts_file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("prompts_file: %w", err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			ids, err := parseIDs(line)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", f, n+1, err)
			}
			c.Prompts = append(c.Prompts, ids)
		}
	}
	switch {
	case c.Model == "":
		return nil, errors.New("--model is required")
	case c.Backend != "cpu" && c.Backend != "cuda" && c.Backend != "auto":
		return nil, fmt.Errorf("backend %q: want cpu, cuda or auto", c.Backend)
	case c.CUDADevice < 0:
		return nil, fmt.Errorf("cuda.device %d: want a device ordinal >= 0", c.CUDADevice)
	case c.Depth < -1:
		return nil, fmt.Errorf("depth %d: want -1 (auto) or a depth >= 0", c.Depth)
	case c.DrainGrace < 0 || c.ShutdownGrace <= 0:
		return nil, fmt.Errorf("drain.grace %v, shutdown.grace %v: want drain.grace >= 0 and shutdown.grace > 0", c.DrainGrace, c.ShutdownGrace)
	case c.SinkQueue < 1:
		return nil, fmt.Errorf("sink.queue %d: want at least 1", c.SinkQueue)
	case len(c.Prompts) > 0 && c.Out == "" && !c.DryRun:
		return nil, errors.New("--out is required with prompts (standalone mode writes each prompt's state there)")
	case len(c.Prompts) > 0 && c.NATS.URL != "" && !c.DryRun:
		return nil, errors.New("--nats-url and prompts: choose the control-plane mode (jobs from the coordinator) or standalone prompts")
	}
	return c, nil
}

// parseIDs reads comma-separated token ids.
func parseIDs(s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("token id %q is not a non-negative integer", f)
		}
		out = append(out, int32(n))
	}
	if len(out) == 0 {
		return nil, errors.New("no token ids")
	}
	return out, nil
}
