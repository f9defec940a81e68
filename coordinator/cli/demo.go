package cli

import (
	"github.com/spf13/cobra"

	"github.com/tandem-inference/tandem/coordinator/demo"
)

func demoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "everything on this machine: embedded NATS, coordinator, CPU prefill worker, 2-rank decode group, two prompts",
		Long: `Run the whole system in this process: an embedded NATS server, a coordinator,
a CPU prefill worker and a 2-rank decode group on loopback, each on its own
NATS connection as separate machines would be. Without --model it writes a
small synthetic K3-shaped model (with a tokenizer) once into --cache-dir.

It measures the rates both ways on a warm-up prompt, then submits a short and
a long text prompt, streams their tokens as text and shows for each how it
was routed (both predicted times to first token) and where its time went. On
one CPU machine the router may keep both prompts local; the long one then
runs again with policy remote to show the disaggregated path.

Then it serves the OpenAI-compatible API on --http-listen (default
127.0.0.1:8000), prints a ready-to-paste curl line for it and keeps serving
until interrupted; --http-listen "" ends the demo after its story.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			v, err := resolve(cmd, demoSettings)
			if err != nil {
				return err
			}
			log, err := newLogger(v, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			var opt demo.Options
			opt.Model, _ = f.GetString("model")
			opt.CacheDir, _ = f.GetString("cache-dir")
			opt.MaxTokens, _ = f.GetInt("max-tokens")
			opt.LongTokens, _ = f.GetInt("long-tokens")
			opt.Threads, _ = f.GetInt("threads")
			opt.HTTPListen, _ = f.GetString("http-listen")
			opt.Stay = opt.HTTPListen != ""
			opt.Log = log
			if opt.CacheDir == "" {
				opt.CacheDir = cacheDir("models")
			}
			return demo.Run(cmd.Context(), opt, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.String("model", "", "checkpoint directory with a tokenizer (default: generate the synthetic demo model)")
	f.String("cache-dir", "", "where the synthetic model is written once (default: <user cache dir>/tandem/models)")
	f.Int("max-tokens", 32, "tokens to generate per prompt")
	f.Int("long-tokens", 1200, "length of the long prompt in tokens")
	f.Int("threads", 0, "compute threads per worker (0: every core)")
	f.String("http-listen", "127.0.0.1:8000", "serve the OpenAI-compatible API here after the story (loopback only; empty: exit after the story)")
	addFlags(f, demoSettings)
	return cmd
}

// demoSettings: the demo's members log only errors by default, so that
// its story reads on its own.
var demoSettings = []setting{
	{"log.level", "error", "log level of the members: debug, info, warn, error"},
	{"log.format", "console", "log format: console or json"},
}
