package cli

import (
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/pflag"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/health"
)

// process names the coordinator's environment variables:
// TANDEM_COORDINATOR_NATS_URL, TANDEM_COORDINATOR_ROUTER_POLICY, ...
const process = "coordinator"

// setting is one configuration key: a flag (dots become dashes), an
// environment variable and a config file key.
type setting = config.Setting

// natsSettings say how to reach NATS: every command has them.
var natsSettings = append(clientSettings(), config.LogSettings...)

// clientSettings are controlplane.ClientSettings, with what an empty
// nats.url means for the coordinator's commands.
func clientSettings() []setting {
	var out []setting
	for _, s := range cp.ClientSettings {
		if s.Key == "nats.url" {
			s.Help = "NATS server URL(s), comma-separated; empty: serve and demo start an embedded server, the client commands use nats://127.0.0.1:4222"
		}
		out = append(out, s)
	}
	return append(out, setting{Key: "nats.client", Default: "", Help: "the client commands' namespace (tandem.v1.clients.<name>) when the credentials are not a tandem identity file (default local)"})
}

// serveSettings configure a coordinator (serve and demo).
var serveSettings = append([]setting{
	{Key: "model", Default: "", Help: "model directory: its config.json (and tokenizer files, to accept text prompts); the weights are not read"},
	{Key: "embedded.host", Default: "127.0.0.1", Help: "embedded NATS server: listen address"},
	{Key: "embedded.port", Default: 4222, Help: "embedded NATS server: client port (0: any free port)"},
	{Key: "embedded.data_dir", Default: "", Help: "embedded NATS server: JetStream directory, where queued jobs survive restarts (default: <user cache dir>/tandem/nats)"},
	{Key: "embedded.max_payload", Bytes: true, Default: "8MiB", Help: "embedded NATS server: largest message (a 1M-token prompt is about 5 MiB)"},
	{Key: "embedded.credentials_dir", Default: "", Help: "embedded NATS server: directory of the tandem identities it admits (coordinator.json, worker.json, client.json, created on first start; more with `coordinator credentials`); default <user config dir>/tandem/nats, and required when embedded.host is not loopback"},
	{Key: "insecure", Default: false, Help: "run the embedded NATS server without any credentials, even beyond loopback (warned at every start): anyone who reaches it can read and forge every job"},
	{Key: "embedded.tls.cert", Default: "", Help: "embedded NATS server: certificate file (turns TLS on)"},
	{Key: "embedded.tls.key", Default: "", Help: "embedded NATS server: key file"},
	{Key: "embedded.tls.ca", Default: "", Help: "embedded NATS server: CA that client certificates must be signed by (requires them)"},
	{Key: "queue.max_jobs", Default: 100000, Help: "jobs held in the queue (queued and running); more are refused as unavailable"},
	{Key: "queue.ack_wait", Default: 30 * time.Second, Help: "how long a job may go without a coordinator's sign of life before another coordinator takes it"},
	{Key: "queue.max_deliver", Default: 5, Help: "deliveries of a job before it is failed"},
	{Key: "queue.duplicate_window", Default: 2 * time.Minute, Help: "how long an idempotency key is remembered"},
	{Key: "queue.memory", Default: false, Help: "keep the queue in memory (lost when the NATS server stops)"},
	{Key: "queue.replicas", Default: 1, Help: "queue stream replicas (clustered NATS)"},
	{Key: "results.ttl", Default: time.Hour, Help: "how long a finished job's final event (with its output) is kept for clients that lost their connection (stored like the queue: queue.memory, queue.replicas)"},
	{Key: "registry.ttl", Default: 10 * time.Second, Help: "a worker silent this long is presumed dead (workers must use the same value)"},
	{Key: "registry.memory", Default: false, Help: "keep the worker registry in memory"},
	{Key: "registry.replicas", Default: 1, Help: "registry bucket replicas (clustered NATS)"},
	{Key: "router.policy", Default: "auto", Help: "routing of jobs that do not choose: auto (smaller predicted time to first token), local or remote"},
	{Key: "router.alpha", Default: 0.2, Help: "weight of a new measurement in the rates' moving average"},
	{Key: "router.pass_floor", Default: time.Duration(0), Help: "seed: one weight pass of the prefill worker with nothing to compute (0: from its heartbeats)"},
	{Key: "router.prefill_tok_s", Default: 0.0, Help: "seed: the prefill worker's prefill rate at a 1,024-token prompt, tokens/s (0: from its heartbeats, fitted per cost term)"},
	{Key: "router.local_prefill_tok_s", Default: 0.0, Help: "seed: the decode group's own prefill rate at a 1,024-token prompt, tokens/s (0: from its heartbeats, fitted per cost term)"},
	{Key: "router.link_bytes_s", Default: 1.25e9, Help: "seed: state transfer bandwidth, bytes/s (default: 10 GbE; measured on long transfers)"},
	{Key: "router.link_rtt", Default: time.Duration(0), Help: "seed: round trip to the decode ranks"},
	{Key: "router.decode_step", Default: time.Duration(0), Help: "seed: one decode step of the group (0: from its heartbeats)"},
	{Key: "limits.max_prompt_tokens", Default: 0, Help: "longest prompt accepted (0: the model's longest sequence)"},
	{Key: "limits.default_max_tokens", Default: 256, Help: "tokens generated when a job does not say"},
	{Key: "limits.max_output_tokens", Default: 32768, Help: "most tokens a job may ask for"},
	{Key: "timeouts.assign", Default: 10 * time.Second, Help: "a worker's answer to an assignment or a cancellation"},
	{Key: "timeouts.placement", Default: time.Minute, Help: "how long a job waits for a decode group with room (or, under policy remote, a prefill worker)"},
	{Key: "timeouts.stall", Default: 2 * time.Minute, Help: "a decoding job whose group reports nothing this long fails"},
	{Key: "timeouts.transfer", Default: 30 * time.Minute, Help: "deadline of a remote job's prefill and transfer"},
	{Key: "timeouts.job", Default: 2 * time.Hour, Help: "longest a job may take from submission to its end"},
	{Key: "timeouts.shutdown_grace", Default: 30 * time.Second, Help: "on shutdown, how long running jobs may finish before they go back to the queue"},
	{Key: "max_running", Default: 1024, Help: "jobs this coordinator drives at once"},
}, health.Settings("127.0.0.1:9464")...)

// addFlags defines a flag for each setting.
func addFlags(fs *pflag.FlagSet, ss []setting) { config.AddFlags(fs, ss) }

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
			out = append(out, x.Key)
		}
	}
	return slices.Clip(out)
}
