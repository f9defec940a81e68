package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// envPrefix prefixes the environment overrides: TANDEM_COORD_NATS_URL,
// TANDEM_COORD_ROUTER_POLICY, ... (dots become underscores).
const envPrefix = "TANDEM_COORD"

// setting is one configuration key: its default (which also gives its
// type) and what it means. Every key is a flag (dots become dashes), an
// environment variable and a config file key.
type setting struct {
	key  string
	def  any
	help string
}

// natsSettings say how to reach NATS: every command has them.
var natsSettings = append(clientSettings(), []setting{
	{"log.level", "info", "log level: debug, info, warn, error"},
	{"log.format", "console", "log format: console or json"},
}...)

// clientSettings are controlplane.ClientSettings, with what an empty
// nats.url means for the coordinator's commands.
func clientSettings() []setting {
	var out []setting
	for _, s := range cp.ClientSettings {
		if s.Key == "nats.url" {
			s.Help = "NATS server URL(s), comma-separated; empty: serve and demo start an embedded server, the client commands use nats://127.0.0.1:4222"
		}
		out = append(out, setting{s.Key, s.Default, s.Help})
	}
	return append(out, setting{"nats.client", "", "the client commands' namespace (tandem.v1.clients.<name>) when the credentials are not a tandem identity file (default local)"})
}

// serveSettings configure a coordinator (serve and demo).
var serveSettings = []setting{
	{"model", "", "model directory: its config.json (and tokenizer files, to accept text prompts); the weights are not read"},
	{"embedded.host", "127.0.0.1", "embedded NATS server: listen address"},
	{"embedded.port", 4222, "embedded NATS server: client port (0: any free port)"},
	{"embedded.data_dir", "", "embedded NATS server: JetStream directory, where queued jobs survive restarts (default: <user cache dir>/tandem/nats)"},
	{"embedded.max_payload", "8MiB", "embedded NATS server: largest message (a 1M-token prompt is about 5 MiB)"},
	{"embedded.credentials_dir", "", "embedded NATS server: directory of the tandem identities it admits (coordinator.json, worker.json, client.json, created on first start; more with `coordinator credentials`); default <user config dir>/tandem/nats, and required when embedded.host is not loopback"},
	{"insecure", false, "run the embedded NATS server without any credentials, even beyond loopback (warned at every start): anyone who reaches it can read and forge every job"},
	{"embedded.tls.cert", "", "embedded NATS server: certificate file (turns TLS on)"},
	{"embedded.tls.key", "", "embedded NATS server: key file"},
	{"embedded.tls.ca", "", "embedded NATS server: CA that client certificates must be signed by (requires them)"},
	{"queue.max_jobs", 100000, "jobs held in the queue (queued and running); more are refused as unavailable"},
	{"queue.ack_wait", 30 * time.Second, "how long a job may go without a coordinator's sign of life before another coordinator takes it"},
	{"queue.max_deliver", 5, "deliveries of a job before it is failed"},
	{"queue.duplicate_window", 2 * time.Minute, "how long an idempotency key is remembered"},
	{"queue.memory", false, "keep the queue in memory (lost when the NATS server stops)"},
	{"queue.replicas", 1, "queue stream replicas (clustered NATS)"},
	{"results.ttl", time.Hour, "how long a finished job's final event (with its output) is kept for clients that lost their connection (stored like the queue: queue.memory, queue.replicas)"},
	{"registry.ttl", 10 * time.Second, "a worker silent this long is presumed dead (workers must use the same value)"},
	{"registry.memory", false, "keep the worker registry in memory"},
	{"registry.replicas", 1, "registry bucket replicas (clustered NATS)"},
	{"router.policy", "auto", "routing of jobs that do not choose: auto (smaller predicted time to first token), local or remote"},
	{"router.alpha", 0.2, "weight of a new measurement in the rates' moving average"},
	{"router.pass_floor", time.Duration(0), "seed: one weight pass of the prefill worker with nothing to compute (0: from its heartbeats)"},
	{"router.prefill_tok_s", 0.0, "seed: the prefill worker's prefill rate at a 1,024-token prompt, tokens/s (0: from its heartbeats, fitted per cost term)"},
	{"router.local_prefill_tok_s", 0.0, "seed: the decode group's own prefill rate at a 1,024-token prompt, tokens/s (0: from its heartbeats, fitted per cost term)"},
	{"router.link_bytes_s", 1.25e9, "seed: state transfer bandwidth, bytes/s (default: 10 GbE; measured on long transfers)"},
	{"router.link_rtt", time.Duration(0), "seed: round trip to the decode ranks"},
	{"router.decode_step", time.Duration(0), "seed: one decode step of the group (0: from its heartbeats)"},
	{"limits.max_prompt_tokens", 0, "longest prompt accepted (0: the model's longest sequence)"},
	{"limits.default_max_tokens", 256, "tokens generated when a job does not say"},
	{"limits.max_output_tokens", 32768, "most tokens a job may ask for"},
	{"timeouts.assign", 10 * time.Second, "a worker's answer to an assignment or a cancellation"},
	{"timeouts.placement", time.Minute, "how long a job waits for a decode group with room (or, under policy remote, a prefill worker)"},
	{"timeouts.stall", 2 * time.Minute, "a decoding job whose group reports nothing this long fails"},
	{"timeouts.transfer", 30 * time.Minute, "deadline of a remote job's prefill and transfer"},
	{"timeouts.job", 2 * time.Hour, "longest a job may take from submission to its end"},
	{"timeouts.shutdown_grace", 30 * time.Second, "on shutdown, how long running jobs may finish before they go back to the queue"},
	{"max_running", 1024, "jobs this coordinator drives at once"},
	{"metrics.listen", "127.0.0.1:9464", "address of the Prometheus /metrics endpoint (empty: off)"},
}

// addFlags defines a flag for each setting.
func addFlags(fs *pflag.FlagSet, ss []setting) {
	for _, s := range ss {
		name := flagName(s.key)
		switch d := s.def.(type) {
		case string:
			fs.String(name, d, s.help)
		case int:
			fs.Int(name, d, s.help)
		case float64:
			fs.Float64(name, d, s.help)
		case bool:
			fs.Bool(name, d, s.help)
		case time.Duration:
			fs.Duration(name, d, s.help)
		case []string:
			fs.StringSlice(name, d, s.help)
		default:
			panic(fmt.Sprintf("setting %s: unsupported default %T", s.key, d))
		}
	}
}

func flagName(key string) string {
	return strings.NewReplacer(".", "-", "_", "-").Replace(key)
}

// load resolves the settings: flags given on the command line, then the
// environment, then the config file, then the defaults.
func load(fs *pflag.FlagSet, configFile string, sets ...[]setting) (*viper.Viper, error) {
	v := viper.New()
	known := map[string]bool{}
	for _, ss := range sets {
		for _, s := range ss {
			v.SetDefault(s.key, s.def)
			known[s.key] = true
			if f := fs.Lookup(flagName(s.key)); f != nil {
				if err := v.BindPFlag(s.key, f); err != nil {
					return nil, err
				}
			}
		}
	}
	v.SetEnvPrefix(envPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if configFile != "" {
		file := viper.New()
		file.SetConfigFile(configFile)
		if err := file.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config %s: %w", configFile, err)
		}
		var unknown []string
		for _, k := range file.AllKeys() {
			if !known[k] {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return nil, fmt.Errorf("config %s: unknown keys %s (see --help for the keys)", configFile, strings.Join(unknown, ", "))
		}
		v.SetConfigFile(configFile)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config %s: %w", configFile, err)
		}
	}
	return v, nil
}

// parseBytes reads a byte size: a number, optionally with a unit (KB, MB,
// GB in powers of 1000; KiB, MiB, GiB in powers of 1024).
func parseBytes(key, s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f*mult > 1<<40 {
		return 0, fmt.Errorf("%s: %q is not a byte size like 8MiB", key, s)
	}
	return int64(f * mult), nil
}

// cacheDir is tandem's folder in the user's cache directory.
func cacheDir(sub string) string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "tandem", sub)
}

// keysOf lists the keys of settings, for help texts.
func keysOf(ss ...[]setting) []string {
	var out []string
	for _, s := range ss {
		for _, x := range s {
			out = append(out, x.key)
		}
	}
	return slices.Clip(out)
}
