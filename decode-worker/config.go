package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/model"
)

// envPrefix prefixes the environment variables: TANDEM_DECODE_RANK,
// TANDEM_DECODE_MESH_IDLE, ...
const envPrefix = "TANDEM_DECODE"

// defaults lists every configuration key with its default. Keys are read
// from flags, then the environment, then the --config file.
var defaults = map[string]any{
	"rank":          0,
	"group_config":  "",
	"model":         "",
	"listen":        "", // default: the rank's endpoint in the group config
	"threads":       0,  // 0: every core
	"memory_budget": "0",
	"micro_batches": 0, // 0: the number of ranks
	"max_batch":     64,
	"prefill_chunk": 512,
	"cache_dtype":   "bf16",
	// The prefix-state cache: finished prompts' states kept in the memory
	// budget for prompts that start the same (every rank of a group alike).
	"prefix_cache.enabled": true,
	"prefix_cache.stride":  0, // extra snapshots every stride tokens (multiple of 64); 0: the prompt's end only
	"latent_norm_eps":      0.0,
	"step_timeout":         5 * time.Minute,
	"mesh.heartbeat":       500 * time.Millisecond,
	"mesh.idle":            3 * time.Second,
	"transfer.handshake":   5 * time.Second,
	"transfer.io":          15 * time.Second,
	"transfer.idle":        15 * time.Second,
	"transfer.keep_alive":  2 * time.Second,
	"frontdoor":            true,
	// The mesh between ranks: tcp, rdma (Thunderbolt 5 RDMA; fail without
	// it) or auto (RDMA where a device has the endpoint's address, else TCP,
	// logged). Over RDMA a rank takes link bootstraps on its endpoint's
	// port + 1 and the prefill worker's TCP on the endpoint.
	"transport":      "tcp",
	"rdma.device":    "", // e.g. rdma_en3; default: the device with the endpoint's IP as a GID
	"rdma.slot_size": 128 << 10,
	"rdma.slots":     16,
	"log.level":      "info",
	"log.format":     "json",
	// Control-plane mode (with nats.url): the rank registers in the worker
	// registry and rank 0 takes the coordinator's jobs.
	"worker_id":          "", // default: <group>-r<rank>
	"advertise":          "", // default: the rank's endpoint
	"registry.ttl":       10 * time.Second,
	"registry.memory":    false,
	"registry.heartbeat": time.Duration(0), // 0: a third of registry.ttl
}

// config is the decode worker's resolved configuration.
type config struct {
	Rank         int
	GroupConfig  string
	Model        string
	Listen       string
	Threads      int
	MemoryBudget int64
	MicroBatches int
	MaxBatch     int
	PrefillChunk int
	CacheDType   model.DType
	PrefixCache  bool
	PrefixStride int
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
}

// loadConfig resolves the configuration from args, the environment and
// the optional --config file.
func loadConfig(args []string) (*config, error) {
	fs := pflag.NewFlagSet("decode-worker", pflag.ContinueOnError)
	fs.Int("rank", 0, "this worker's rank in the decode group")
	fs.String("group-config", "", "the decode group's YAML file: group, secret, ranks (endpoint, layers, memory_budget) (required)")
	fs.String("model", "", "checkpoint directory: config.json + safetensors shards (required)")
	fs.String("config", "", "optional worker config file (YAML/JSON/TOML) with any of the keys below")
	fs.String("listen", "", "listen address (default: the rank's endpoint)")
	fs.Int("threads", 0, "CPU threads for compute (0: all)")
	fs.String("memory-budget", "0", "sequence state memory budget, e.g. 64GiB (0: the group config's, else unlimited)")
	fs.Int("micro-batches", 0, "steps in flight (0: the number of ranks)")
	fs.Int("max-batch", 64, "sequences per decode step")
	fs.Int("prefill-chunk", 512, "prompt rows per prefill step, a multiple of 64 (negative: whole prompts)")
	fs.String("cache-dtype", "bf16", "MLA latent cache dtype: bf16 (the state contract) or f32")
	fs.String("log-level", "info", "log level: debug (every step), info, warn, error")
	fs.String("log-format", "json", "log format: json or console")
	fs.String("nats-url", "", "control-plane mode: the coordinator's NATS URL; the rank registers and rank 0 takes its jobs (empty: front door only)")
	fs.String("worker-id", "", "control-plane mode: this rank's worker id (default <group>-r<rank>)")
	fs.String("nats-credentials", "", "control-plane mode: the worker's identity file (worker.json from `coordinator credentials`; default: this machine's, when present)")
	fs.String("advertise", "", "control-plane mode: host:port other workers reach this rank on (default: its endpoint in the group file)")
	fs.Duration("registry-ttl", 10*time.Second, "control-plane mode: the worker registry's TTL when this worker creates it (a server without tandem identities); with an identity the bucket's own")
	if err := fs.Parse(args); err != nil {
		return nil, err
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
	for key, flag := range map[string]string{"rank": "rank", "group_config": "group-config", "model": "model",
		"listen": "listen", "threads": "threads", "memory_budget": "memory-budget", "micro_batches": "micro-batches",
		"max_batch": "max-batch", "prefill_chunk": "prefill-chunk", "cache_dtype": "cache-dtype",
		"log.level": "log-level", "log.format": "log-format", "nats.url": "nats-url", "worker_id": "worker-id",
		"nats.credentials": "nats-credentials", "advertise": "advertise", "registry.ttl": "registry-ttl"} {
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
	c := &config{Rank: v.GetInt("rank"), GroupConfig: v.GetString("group_config"), Model: v.GetString("model"),
		Listen: v.GetString("listen"), Threads: v.GetInt("threads"), MicroBatches: v.GetInt("micro_batches"),
		MaxBatch: v.GetInt("max_batch"), PrefillChunk: v.GetInt("prefill_chunk"), LatentEps: v.GetFloat64("latent_norm_eps"),
		PrefixCache: v.GetBool("prefix_cache.enabled"), PrefixStride: v.GetInt("prefix_cache.stride"),
		StepTimeout: v.GetDuration("step_timeout"), Heartbeat: v.GetDuration("mesh.heartbeat"), Idle: v.GetDuration("mesh.idle"),
		Handshake: v.GetDuration("transfer.handshake"), IO: v.GetDuration("transfer.io"),
		TransferIdle: v.GetDuration("transfer.idle"), KeepAlive: v.GetDuration("transfer.keep_alive"),
		Frontdoor: v.GetBool("frontdoor"), Transport: v.GetString("transport"),
		RDMA:     rdma.Config{Device: v.GetString("rdma.device"), SlotSize: v.GetInt("rdma.slot_size"), Slots: v.GetInt("rdma.slots")},
		LogLevel: v.GetString("log.level"), LogFormat: v.GetString("log.format"),
		WorkerID: v.GetString("worker_id"), Advertise: v.GetString("advertise"), Beat: v.GetDuration("registry.heartbeat"),
		Registry: controlplane.RegistryConfig{TTL: v.GetDuration("registry.ttl"), Memory: v.GetBool("registry.memory")},
		NATS:     controlplane.OptionsFromSettings(v.GetString, v.GetDuration)}
	c.NATS.MaxReconnects = -1 // a worker keeps trying for as long as it runs
	var err error
	if c.MemoryBudget, err = parseBytes(v.GetString("memory_budget")); err != nil {
		return nil, fmt.Errorf("memory_budget: %w", err)
	}
	if c.CacheDType, err = model.ParseCacheDType(v.GetString("cache_dtype")); err != nil {
		return nil, fmt.Errorf("cache_dtype: %w", err)
	}
	switch c.Transport {
	case "tcp", "rdma", "auto":
	default:
		return nil, fmt.Errorf("transport %q: want tcp, rdma or auto", c.Transport)
	}
	switch {
	case c.GroupConfig == "":
		return nil, errors.New("--group-config is required")
	case c.Model == "":
		return nil, errors.New("--model is required")
	case c.Rank < 0:
		return nil, fmt.Errorf("--rank %d is negative", c.Rank)
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
}

type rankFile struct {
	Endpoint     string `mapstructure:"endpoint"`
	Layers       []int  `mapstructure:"layers"` // [lo, hi); all ranks or none
	MemoryBudget string `mapstructure:"memory_budget"`
}

// loadGroup reads the group config file: the layout (layers split evenly
// when no rank lists them) and the mesh secret, from the file, the file
// named by secret_file, or $TANDEM_GROUP_SECRET.
func loadGroup(path string, numLayers int) (*rank.Layout, []byte, error) {
	v := viper.New()
	v.SetConfigFile(path)
	v.SetDefault("group", "decode")
	if err := v.ReadInConfig(); err != nil {
		return nil, nil, fmt.Errorf("group config %s: %w", path, err)
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
	l, err := rank.Even(gf.Group, numLayers, eps)
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
		if l.Ranks[i].MemoryBudget, err = parseBytes(r.MemoryBudget); err != nil {
			return nil, nil, fmt.Errorf("group config %s: rank %d memory_budget: %w", path, i, err)
		}
	}
	if err := l.Validate(numLayers); err != nil {
		return nil, nil, fmt.Errorf("group config %s: %w", path, err)
	}
	return l, secret, nil
}

// parseBytes reads a byte size: a plain number or one with a unit (KB, MB,
// GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f*mult > 1<<62 {
		return 0, fmt.Errorf("%q is not a byte size like 512MiB or 64GiB", s)
	}
	return int64(f * mult), nil
}
