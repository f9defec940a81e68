// Package cli is the coordinator binary's command line: serve, submit,
// jobs, workers, cancel and demo, with configuration from flags,
// TANDEM_COORDINATOR_* environment variables and an optional config file
// (package internal/config).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/tokenizer"
)

var rootHelp = `tandem's coordinator: it takes jobs over NATS, routes each one between a
GPU prefill worker and the decode group's own prefill by predicted time to
first token, drives it through prefill, state transfer and decode, and
streams its tokens and events back.

  coordinator demo                 everything on this machine, one command
  coordinator serve --model DIR    a coordinator (embedded NATS unless --nats-url) and its
                                   OpenAI-compatible API on 127.0.0.1:8000
  coordinator api --model DIR      the OpenAI-compatible API alone, for a deployment's NATS
  coordinator submit "prompt"      run a job and stream its tokens
  coordinator jobs | workers       what is queued, running, registered
  coordinator cancel JOB
  coordinator cache list|drop      the prefix-state cache entries of the workers
  coordinator credentials          the NATS identities (coordinator, worker, clients)

configs/local.yaml and configs/cluster.yaml are example config files.

` + config.Help(process)

// New returns the coordinator's root command writing to stdout and stderr.
func New(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "coordinator",
		Short:         "tandem's coordinator: job routing, lifecycle and streaming over NATS",
		Long:          rootHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().String("config", "", "YAML config file with any of the keys below (nested by their dots)")
	root.AddCommand(serveCmd(), apiCmd(), submitCmd(), jobsCmd(), workersCmd(), drainCmd(), cacheCmd(), cancelCmd(), demoCmd(), credentialsCmd())
	return root
}

// Execute runs the command line; it returns the process exit status.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := New(stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "coordinator: %v\n", err)
		return 1
	}
	return 0
}

// resolve loads the settings of cmd.
func resolve(cmd *cobra.Command, sets ...[]setting) (*viper.Viper, error) {
	file, _ := cmd.Flags().GetString("config")
	return config.Load(cmd.Flags(), process, file, sets...)
}

func newLogger(v *viper.Viper, w io.Writer) (*zap.Logger, error) {
	return config.NewLogger(v.GetString("log.level"), v.GetString("log.format"), w)
}

// natsOptions are the client options from the settings; url overrides
// nats.url when set (the embedded server's).
func natsOptions(v *viper.Viper, name, url string, log *zap.Logger) cp.Options {
	o := cp.OptionsFromSettings(v.GetString, v.GetDuration)
	o.Name, o.Logger = name, log
	if url != "" {
		o.URL = url
	}
	return o
}

// connect connects a command to NATS as principal p: with the configured
// credentials, or else this machine's identity of p (written by the first
// embedded server). A client's namespace is its identity's name, or
// nats.client when its credentials are not a tandem identity.
func connect(cmd *cobra.Command, v *viper.Viper, name string, p cp.Principal) (*nats.Conn, error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), natsOptions(v, name, "", nil).ConnectTimeout+time.Second)
	defer cancel()
	return connectCtx(ctx, v, name, p)
}

// connectCtx is connect within ctx: the submit command, which reconnects
// forever, also waits for a server that is down when it starts.
func connectCtx(ctx context.Context, v *viper.Viper, name string, p cp.Principal) (*nats.Conn, error) {
	o := natsOptions(v, name, "", nil)
	if o.URL == "" {
		o.URL = nats.DefaultURL
	}
	o.UseLocalIdentity(p)
	if p == cp.PrincipalClient && o.IdentityFile == "" {
		client := v.GetString("nats.client")
		if client == "" {
			client = cp.DefaultClient
		}
		if err := cp.CheckID(client); err != nil {
			return nil, fmt.Errorf("nats.client: %w", err)
		}
		o.InboxPrefix = cp.InboxPrefix(cp.PrincipalClient, client)
	}
	o.MaxReconnects = 3
	if name == submitConnName {
		// A job outlives any outage of NATS or the coordinator: the
		// client follows it until --timeout.
		o.MaxReconnects = -1
		o.ReconnectWait, o.RetryConnect = 250*time.Millisecond, true
	}
	nc, err := cp.Connect(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("%w (start a coordinator with `coordinator serve`, or give --nats-url)", err)
	}
	return nc, nil
}

// serverConfig is the embedded NATS server's configuration, and the
// directory of the identities it admits (withIdentities reads them):
// embedded.credentials_dir, by default this machine's own directory when
// the server listens on loopback only; beyond loopback the directory must
// be given, or --insecure (no authentication, warned at every start; the
// directory is then "").
func serverConfig(v *viper.Viper, log *zap.Logger) (cp.ServerConfig, string, error) {
	if log == nil {
		log = zap.NewNop()
	}
	payload, err := config.ParseBytes(v.GetString("embedded.max_payload"))
	if err != nil {
		return cp.ServerConfig{}, "", fmt.Errorf("embedded.max_payload: %w", err)
	}
	if payload > 64<<20 {
		return cp.ServerConfig{}, "", fmt.Errorf("embedded.max_payload %d: at most 64 MiB", payload)
	}
	dir := v.GetString("embedded.data_dir")
	if dir == "" {
		dir = cacheDir("nats")
	}
	sc := cp.ServerConfig{Host: v.GetString("embedded.host"), Port: v.GetInt("embedded.port"), DataDir: dir,
		MaxPayload: int32(payload), Logger: log}
	for _, k := range []string{"nats.user", "nats.password", "nats.token", "nats.nkey_seed_file", "nats.creds_file", "nats.credentials"} {
		if v.GetString(k) != "" {
			return cp.ServerConfig{}, "", fmt.Errorf("%s is set, but it logs in to an external NATS (nats.url); the embedded server's users are the identities in embedded.credentials_dir", k)
		}
	}
	host := sc.Host
	if host == "" {
		host = "127.0.0.1"
	}
	creds := v.GetString("embedded.credentials_dir")
	switch {
	case v.GetBool("insecure"):
		sc.Insecure = true
		log.Warn("INSECURE: the embedded NATS server requires no credentials (--insecure): anyone who reaches "+host+
			" can read every job's prompt and tokens, forge its progress and take its transfer secrets", zap.String("host", host))
		return withTLS(v, sc), "", nil
	case creds == "" && !cp.IsLoopback(host):
		return cp.ServerConfig{}, "", fmt.Errorf("embedded.host %s listens beyond loopback, so the embedded NATS server needs credentials: "+
			"set embedded.credentials_dir (the coordinator, worker and client identities are created there on first start; "+
			"give the workers worker.json and the clients client.json), or pass --insecure to run without any", host)
	case creds == "":
		d, err := cp.DefaultCredentialsDir()
		if err != nil {
			return cp.ServerConfig{}, "", err
		}
		creds = d
	}
	return withTLS(v, sc), creds, nil
}

// withIdentities gives the embedded server the identities in dir,
// creating them on first use ("" leaves it open: --insecure).
func withIdentities(sc cp.ServerConfig, dir string, log *zap.Logger) (cp.ServerConfig, error) {
	if dir == "" {
		return sc, nil
	}
	ids, err := cp.EnsureCredentials(dir)
	if err != nil {
		return sc, err
	}
	sc.Identities = ids
	log.Info("embedded NATS server credentials", zap.String("dir", dir), zap.Int("identities", len(ids)))
	return sc, nil
}

func withTLS(v *viper.Viper, sc cp.ServerConfig) cp.ServerConfig {
	if cert, key, ca := v.GetString("embedded.tls.cert"), v.GetString("embedded.tls.key"), v.GetString("embedded.tls.ca"); cert != "" || key != "" || ca != "" {
		sc.TLS = &cp.TLSFiles{Cert: cert, Key: key, CA: ca}
	}
	return sc
}

// loadModel reads the model's config.json and, when the directory has
// one, its tokenizer.
func loadModel(dir string) (*modelinfo.Info, *tokenizer.Tokenizer, error) {
	if dir == "" {
		return nil, nil, errors.New("--model is required: the model directory (its config.json; tokenizer files to accept text)")
	}
	info, err := modelinfo.Load(dir)
	if err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(dir + "/" + tokenizer.ModelFile); err != nil {
		return info, nil, nil
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, nil, err
	}
	return info, tok, nil
}

// serviceConfig is the coordinator's configuration from the settings.
func serviceConfig(v *viper.Viper) (service.Config, error) {
	policy := cp.Policy(v.GetString("router.policy"))
	switch policy {
	case cp.PolicyAuto, cp.PolicyLocal, cp.PolicyRemote:
	default:
		return service.Config{}, fmt.Errorf("router.policy %q: want auto, local or remote", policy)
	}
	for _, k := range []string{"router.prefill_tok_s", "router.local_prefill_tok_s", "router.link_bytes_s"} {
		if v.GetFloat64(k) < 0 {
			return service.Config{}, fmt.Errorf("%s is %v: a rate cannot be negative", k, v.GetFloat64(k))
		}
	}
	if a := v.GetFloat64("router.alpha"); a <= 0 || a > 1 {
		return service.Config{}, fmt.Errorf("router.alpha %v: want 0 < alpha <= 1", a)
	}
	lim, err := imageLimits(v)
	if err != nil {
		return service.Config{}, err
	}
	return service.Config{
		Policy: policy,
		Images: lim,
		Rates: router.Rates{PassFloor: v.GetDuration("router.pass_floor"), LinkBytesPerS: v.GetFloat64("router.link_bytes_s"),
			LinkRTT: v.GetDuration("router.link_rtt"), DecodeStep: v.GetDuration("router.decode_step")},
		SeedPrefillTokPerS: v.GetFloat64("router.prefill_tok_s"), SeedLocalTokPerS: v.GetFloat64("router.local_prefill_tok_s"),
		Alpha:            v.GetFloat64("router.alpha"),
		MaxPromptTokens:  v.GetInt("limits.max_prompt_tokens"),
		DefaultMaxTokens: v.GetInt("limits.default_max_tokens"),
		MaxOutputTokens:  v.GetInt("limits.max_output_tokens"),
		Queue: cp.QueueConfig{MaxJobs: int64(v.GetInt("queue.max_jobs")), AckWait: v.GetDuration("queue.ack_wait"),
			MaxDeliver: v.GetInt("queue.max_deliver"), DuplicateWindow: v.GetDuration("queue.duplicate_window"),
			Memory: v.GetBool("queue.memory"), Replicas: v.GetInt("queue.replicas")},
		Registry: cp.RegistryConfig{TTL: v.GetDuration("registry.ttl"), Memory: v.GetBool("registry.memory"),
			Replicas: v.GetInt("registry.replicas")},
		Results: cp.ResultsConfig{TTL: v.GetDuration("results.ttl"), Memory: v.GetBool("queue.memory"),
			Replicas: v.GetInt("queue.replicas")},
		MaxRunning:      v.GetInt("max_running"),
		AssignTimeout:   v.GetDuration("timeouts.assign"),
		PlacementWait:   v.GetDuration("timeouts.placement"),
		StallTimeout:    v.GetDuration("timeouts.stall"),
		TransferTimeout: v.GetDuration("timeouts.transfer"),
		JobTimeout:      v.GetDuration("timeouts.job"),
		ShutdownGrace:   v.GetDuration("timeouts.shutdown_grace"),
	}, nil
}

// settingsHelp lists the config keys for a command's long help, and
// where settings come from.
func settingsHelp(ss ...[]setting) string {
	return "Config keys: " + strings.Join(keysOf(ss...), ", ") + ".\n\n" + config.Help(process)
}
