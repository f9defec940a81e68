package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

// envPrefix prefixes the environment variables: TANDEM_PREFILL_MEM_BUDGET,
// TANDEM_PREFILL_SINK_TIMEOUT, ...
const envPrefix = "TANDEM_PREFILL"

// defaults lists every configuration key with its default. Keys are read
// from flags, then the environment, then the --config file.
var defaults = map[string]any{
	"model":              "",
	"mem_budget":         "8GiB",
	"backend":            "cpu",
	"cuda.device":        0,
	"threads":            0,  // 0: every core
	"depth":              -1, // -1: the planner chooses from the budget
	"cache_dtype":        "bf16",
	"latent_norm_eps":    0.0,
	"io":                 "auto",
	"read_size":          "8MiB",
	"readers":            streamer.DefaultReaders,
	"max_tile":           0, // 0: the planner's default
	"sink.queue":         4,
	"sink.timeout":       time.Minute,
	"sink.close_timeout": 5 * time.Minute,
	"prompt":             []string{},
	"prompts_file":       "",
	"out":                "",
	"dry_run":            false,
	"memory_limit":       true, // set the Go runtime's memory limit to the budget
	"log.level":          "info",
	"log.format":         "console",
	// Control-plane mode (with nats.url): the worker registers in the
	// worker registry and takes the coordinator's jobs, streaming each
	// job's state to its decode ranks over kvtransfer.
	"worker_id":           "", // default: prefill-<host name>
	"registry.ttl":        10 * time.Second,
	"registry.memory":     false,
	"registry.heartbeat":  time.Duration(0), // 0: a third of registry.ttl
	"transfer.conns":      0,                // connections per decode rank (0: kvtransfer's default)
	"transfer.handshake":  5 * time.Second,
	"transfer.io":         15 * time.Second,
	"transfer.idle":       15 * time.Second,
	"transfer.keep_alive": 2 * time.Second,
}

// config is the prefill worker's resolved configuration.
type config struct {
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
}

// loadConfig resolves the configuration from args, the environment and the
// optional --config file.
func loadConfig(args []string) (*config, error) {
	fs := pflag.NewFlagSet("prefill-worker", pflag.ContinueOnError)
	fs.String("model", "", "checkpoint directory: config.json + safetensors shards (required)")
	fs.String("config", "", "optional config file (YAML/JSON/TOML) with any of the keys in config.go")
	fs.String("mem-budget", "8GiB", "memory budget for weights ring, states, activations and temporaries, e.g. 512MiB, 24GiB")
	fs.String("backend", "cpu", "compute backend: cpu, cuda (an NVIDIA GPU through the driver, libcuda.so.1) or auto (cuda if usable, else cpu)")
	fs.Int("cuda-device", 0, "CUDA device ordinal (--backend cuda or auto)")
	fs.Int("threads", 0, "CPU threads for compute (0: all)")
	fs.Int("depth", -1, "prefetch depth: layers read ahead of compute (-1: chosen from the budget)")
	fs.String("cache-dtype", "bf16", "MLA latent cache dtype: bf16 (the state contract) or f32")
	fs.Float64("latent-norm-eps", 0, "override the MLA latent norm eps (0: the config's)")
	fs.String("io", "auto", "weight reads: auto (direct I/O where possible), direct (required) or buffered")
	fs.String("read-size", "8MiB", "bytes per read request")
	fs.Int("readers", streamer.DefaultReaders, "read requests in flight")
	fs.Int("max-tile", 0, "most token rows per layer call (0: planner default)")
	fs.StringArray("prompt", nil, "standalone mode: a prompt as comma-separated token ids (repeatable); all prompts share passes")
	fs.String("prompts-file", "", "standalone mode: a file with one prompt (comma-separated token ids) per line")
	fs.String("out", "", "standalone mode: directory for the states, one <job>.k3st file per prompt (SeqState encoding)")
	fs.Bool("dry-run", false, "print the pass plans for the prompts and exit without reading weights")
	fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.String("log-format", "console", "log format: console or json")
	fs.String("nats-url", "", "control-plane mode: the coordinator's NATS URL; the worker registers and takes its jobs")
	fs.String("worker-id", "", "control-plane mode: this worker's id (default prefill-<host name>)")
	fs.String("nats-credentials", "", "control-plane mode: the worker's identity file (worker.json from `coordinator credentials`; default: this machine's, when present)")
	fs.Duration("registry-ttl", 10*time.Second, "control-plane mode: the worker registry's TTL when this worker creates it (a server without tandem identities); with an identity the bucket's own")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	for _, s := range controlplane.ClientSettings {
		v.SetDefault(s.Key, s.Default)
	}
	v.SetEnvPrefix(envPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	for key, flag := range map[string]string{"model": "model", "mem_budget": "mem-budget", "backend": "backend",
		"cuda.device": "cuda-device", "threads": "threads", "depth": "depth", "cache_dtype": "cache-dtype", "latent_norm_eps": "latent-norm-eps",
		"io": "io", "read_size": "read-size", "readers": "readers", "max_tile": "max-tile", "prompt": "prompt",
		"prompts_file": "prompts-file", "out": "out", "dry_run": "dry-run", "log.level": "log-level", "log.format": "log-format",
		"nats.url": "nats-url", "nats.credentials": "nats-credentials", "worker_id": "worker-id", "registry.ttl": "registry-ttl"} {
		if err := v.BindPFlag(key, fs.Lookup(flag)); err != nil {
			return nil, err
		}
	}
	if f, _ := fs.GetString("config"); f != "" {
		v.SetConfigFile(f)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config %s: %w", f, err)
		}
	}
	c := &config{Model: v.GetString("model"), Backend: v.GetString("backend"), CUDADevice: v.GetInt("cuda.device"), Threads: v.GetInt("threads"),
		Depth: v.GetInt("depth"), LatentEps: v.GetFloat64("latent_norm_eps"), Readers: v.GetInt("readers"),
		MaxTile: v.GetInt("max_tile"), SinkQueue: v.GetInt("sink.queue"), SinkTimeout: v.GetDuration("sink.timeout"),
		CloseTimeout: v.GetDuration("sink.close_timeout"), Out: v.GetString("out"), DryRun: v.GetBool("dry_run"),
		MemoryLimit: v.GetBool("memory_limit"), LogLevel: v.GetString("log.level"), LogFormat: v.GetString("log.format"),
		WorkerID: v.GetString("worker_id"), Beat: v.GetDuration("registry.heartbeat"), TransferConns: v.GetInt("transfer.conns"),
		Registry: controlplane.RegistryConfig{TTL: v.GetDuration("registry.ttl"), Memory: v.GetBool("registry.memory")},
		Transfer: kvtransfer.Timeouts{Handshake: v.GetDuration("transfer.handshake"), IO: v.GetDuration("transfer.io"),
			Idle: v.GetDuration("transfer.idle"), KeepAlive: v.GetDuration("transfer.keep_alive")},
		NATS: controlplane.OptionsFromSettings(v.GetString, v.GetDuration)}
	c.NATS.MaxReconnects = -1 // a worker keeps trying for as long as it runs
	var err error
	if c.Budget, err = planner.ParseBytes(v.GetString("mem_budget")); err != nil {
		return nil, fmt.Errorf("mem_budget: %w", err)
	}
	if c.ReadSize, err = planner.ParseBytes(v.GetString("read_size")); err != nil {
		return nil, fmt.Errorf("read_size: %w", err)
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
