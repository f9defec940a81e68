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
until interrupted; --http-listen "" ends the demo after its story.

` + settingsHelp(demoSettings),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			opt.Model, opt.CacheDir = v.GetString("model"), v.GetString("cache_dir")
			opt.MaxTokens, opt.LongTokens, opt.Threads = v.GetInt("max_tokens"), v.GetInt("long_tokens"), v.GetInt("threads")
			opt.HTTPListen = v.GetString("http.listen")
			opt.Stay = opt.HTTPListen != ""
			opt.Log = log
			if opt.CacheDir == "" {
				opt.CacheDir = cacheDir("models")
			}
			return demo.Run(cmd.Context(), opt, cmd.OutOrStdout())
		},
	}
	addFlags(cmd.Flags(), demoSettings)
	return cmd
}

// demoSettings: the demo's members log only errors by default, so that
// its story reads on its own.
var demoSettings = []setting{
	{Key: "model", Default: "", Help: "checkpoint directory with a tokenizer (default: generate the synthetic demo model)"},
	{Key: "cache_dir", Default: "", Help: "where the synthetic model is written once (default: <user cache dir>/tandem/models)"},
	{Key: "max_tokens", Default: 32, Help: "tokens to generate per prompt"},
	{Key: "long_tokens", Default: 1200, Help: "length of the long prompt in tokens"},
	{Key: "threads", Default: 0, Help: "compute threads per worker (0: every core)"},
	{Key: "http.listen", Default: "127.0.0.1:8000", Help: "serve the OpenAI-compatible API here after the story (loopback only; empty: exit after the story)"},
	{Key: "log.level", Default: "error", Help: "log level of the members: debug, info, warn, error"},
	{Key: "log.format", Default: "console", Help: "log format: console (for people) or json (one object a line)"},
}
