// Package demo is the one-command demonstration: on this machine, in one
// process, an embedded NATS server, a coordinator, a CPU prefill worker and
// a 2-rank decode group; a short and a long text prompt go through the
// control plane, their tokens stream back as text, and for each job it
// shows how it was routed (both predictions) and where its time went.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Options configure the demo. Zero values take the defaults named.
type Options struct {
	// Model is a checkpoint directory with a tokenizer; empty generates
	// the synthetic "demo" preset into CacheDir once.
	Model    string
	CacheDir string
	// MaxTokens per job (default 32); LongTokens is the long prompt's
	// length in tokens (default 1200).
	MaxTokens, LongTokens int
	// Threads per compute backend (0: every core).
	Threads int
	// HTTPListen, when set, serves the OpenAI-compatible API there once
	// the story is told, and prints a curl line for it; Stay then keeps
	// serving until ctx ends.
	HTTPListen string
	Stay       bool
	Log        *zap.Logger
}

// registryConfig is the demo's worker registry: in memory, heartbeats
// every second.
var registryConfig = cp.RegistryConfig{Memory: true, TTL: 3 * time.Second}

// Preset is the synthetic model the demo generates.
const Preset = "demo"

const shortPrompt = "Tandem: prefill where the compute is, decode where the memory is. In one sentence, why?"

// Run runs the demo, writing its story to out.
func Run(ctx context.Context, opt Options, out io.Writer) error {
	start := time.Now()
	if opt.MaxTokens <= 0 {
		opt.MaxTokens = 32
	}
	if opt.LongTokens <= 0 {
		opt.LongTokens = 1200
	}
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	p := func(format string, args ...any) { fmt.Fprintf(out, format, args...) }
	p("tandem demo: a coordinator, a CPU prefill worker and a 2-rank decode group on this machine, over NATS\n\n")

	dir := opt.Model
	if dir == "" {
		cache := opt.CacheDir
		if cache == "" {
			base, err := os.UserCacheDir()
			if err != nil {
				base = os.TempDir()
			}
			cache = filepath.Join(base, "tandem", "models")
		}
		t := time.Now()
		var err error
		if dir, err = synth.Ensure(ctx, cache, Preset, 1, 2); err != nil {
			return fmt.Errorf("demo model: %w", err)
		}
		p("model: the synthetic %q preset (K3's structure at a small size, random weights: its text is noise)\n  %s (%s)\n",
			Preset, dir, client.Duration(time.Since(t)))
	} else {
		p("model: %s\n", dir)
	}

	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, Threads: opt.Threads, Log: opt.Log,
		Queue:    cp.QueueConfig{Memory: true},
		Registry: registryConfig,
		// The rates are measured below, except the link's: on loopback a
		// transfer's tail is too short to measure, so it is taken as 1 GB/s.
		Coordinator: service.Config{Alpha: 0.5, Rates: router.Rates{LinkBytesPerS: 1e9}}})
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Tokenizer == nil {
		return fmt.Errorf("model %s has no tokenizer (%s): the demo sends text; give a model with one", dir, tokenizer.ModelFile)
	}
	if err := c.WaitReady(ctx); err != nil {
		return err
	}
	p("NATS: embedded server at %s, JetStream job queue and worker registry\n", c.URL)
	p("prefill worker: prefill-0, CPU, streams each layer's weights from disk, 256 MiB budget\n")
	for r, s := range c.Group.Layout.Ranks {
		p("decode rank %d: %s, layers [%d,%d), kvtransfer at %s\n", r, c.RankID(r), s.Lo, s.Hi, s.Endpoint)
	}
	nc, err := c.Connect(ctx, "demo-client")
	if err != nil {
		return err
	}
	defer nc.Close()

	// Measure this machine both ways before routing anything: the workers
	// fit their cost-model terms to these prefills and advertise them. A
	// worker's first prefill pays its process's one-time costs and gives
	// way to the next sample (costmodel.Fitter): a throwaway 64 first.
	warm := c.Tokenizer.Encode(string(tokenizer.DefaultCorpus()))
	for _, n := range []int{64, 64, 512} {
		for _, pol := range []cp.Policy{cp.PolicyLocal, cp.PolicyRemote} {
			if _, err := quiet(ctx, nc, ids(warm[:min(len(warm), n)]), pol); err != nil {
				return fmt.Errorf("warm-up (%s): %w", pol, err)
			}
		}
	}
	pf, g, err := waitMeasured(ctx, c)
	if err != nil {
		return err
	}
	p("\nmeasured on warm-up prompts of 64 and 512 tokens (after a first 64 that pays the one-time costs), both ways (each worker fits its compute per cost term to its own prefills):\n"+
		"  prefill worker: %s; pass floor %s (its weights at the %.2f GB/s its reads ran)\n  decode group's own prefill: %s\n",
		pf.Compute.Compute(), client.Duration(pf.PassFloor), pf.ReadBytesPerSec/1e9, g.Compute.Compute())

	long := longPrompt(c.Tokenizer, opt.LongTokens)
	var runs []*run
	short, err := job(ctx, nc, out, "short prompt", shortPrompt, cp.PolicyAuto, opt.MaxTokens)
	if err != nil {
		return err
	}
	runs = append(runs, short)
	res, err := job(ctx, nc, out, "long prompt", long, cp.PolicyAuto, opt.MaxTokens)
	if err != nil {
		return err
	}
	runs = append(runs, res)
	// Both paths, whatever auto chose: the same prompt the other way.
	other, title := cp.PolicyRemote, "long prompt again, policy remote"
	if res.Final.Route.Target == cp.TargetRemote {
		other, title = cp.PolicyLocal, "long prompt again, policy local"
		p("\nThe router sent the long prompt to the prefill worker. To compare, the same prompt runs again\n" +
			"with policy local: the decode group prefills it itself.\n")
	} else {
		p("\nThe router kept the long prompt on the decode group: it predicts the prefill worker no faster here\n" +
			"(on one CPU machine both share the same cores). To show the disaggregated path anyway, the same\n" +
			"prompt runs again with policy remote: the prefill worker prefills it and streams each layer's state\n" +
			"to the decode ranks over kvtransfer while the next layer computes.\n")
	}
	again, err := job(ctx, nc, out, title, long, other, opt.MaxTokens)
	if err != nil {
		return err
	}
	runs = append(runs, again)
	if !slices.Equal(again.Tokens, res.Tokens) {
		return fmt.Errorf("the %s run generated other tokens than the %s run:\n %v\n %v", again.Final.Route.Target, res.Final.Route.Target, res.Tokens, again.Tokens)
	}
	p("same %d tokens both ways: the transferred state is the state the decode group computes itself\n", len(again.Tokens))

	p("\npredicted against measured time to first token (measured: the client's, submission to first token):\n")
	for _, r := range runs {
		rt := r.Final.Route
		p("  %-34s %-6s predicted %s, measured %s (x%.2f); the other path was predicted at %s\n", r.title, rt.Target,
			predicted(rt, rt.Target), client.Duration(r.ttft), r.ttft.Seconds()/max(predictedOf(rt, rt.Target).Seconds(), 1e-9),
			predicted(rt, otherTarget(rt.Target)))
	}
	fast := res
	if again.ttft < res.ttft {
		fast = again
	}
	verdict := "right"
	if fast != res {
		verdict = "wrong"
	}
	p("auto chose %s for the long prompt: measured %s there against %s %s, so the choice was %s\n",
		res.Final.Route.Target, client.Duration(res.ttft), client.Duration(again.ttft), again.Final.Route.Target, verdict)
	p("\ndemo finished in %s\n", client.Duration(time.Since(start)))
	if opt.HTTPListen == "" {
		return nil
	}
	return serveAPI(ctx, c, dir, opt, p)
}

// serveAPI serves the OpenAI-compatible API for the demo's cluster and
// prints a curl line for it.
func serveAPI(ctx context.Context, c *cluster.Cluster, dir string, opt Options, p func(string, ...any)) error {
	nc, err := c.Connect(ctx, "demo-api")
	if err != nil {
		return err
	}
	defer nc.Close()
	name := openai.ModelName(dir, c.Model)
	srv, err := openai.New(openai.Config{Conn: nc, Model: c.Model, Tokenizer: c.Tokenizer, ModelName: name, Log: opt.Log.Named("api")})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, opt.HTTPListen, func(addr string) { ready <- addr }) }()
	select {
	case err := <-done:
		return err
	case addr := <-ready:
		p("\nOpenAI-compatible API at http://%s/v1 (model %q); try:\n  %s\n", addr, name, openai.CurlLine(addr, name, ""))
	}
	if !opt.Stay {
		cancel()
		return <-done
	}
	p("serving it until interrupted (Ctrl-C)\n")
	return <-done
}

// longPrompt is n tokens of the tokenizer's corpus, as text.
func longPrompt(tok *tokenizer.Tokenizer, n int) string {
	corpus := string(tokenizer.DefaultCorpus())
	var toks []int
	for len(toks) < n {
		toks = append(toks, tok.Encode(corpus)...)
	}
	text, err := tok.DecodeString(toks[:n])
	if err != nil {
		return corpus
	}
	return text
}

func ids(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// quiet runs a job without showing it.
func quiet(ctx context.Context, nc *nats.Conn, prompt []int32, pol cp.Policy) (*client.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: prompt, Sampling: cp.Sampling{MaxTokens: 4}, Policy: pol}, client.Handlers{})
	if err != nil {
		return nil, err
	}
	return res, res.Err()
}

// run is a job the demo showed: its result, title and the client's TTFT.
type run struct {
	*client.Result
	title string
	ttft  time.Duration
}

func predictedOf(rt *cp.RouteDecision, t cp.Target) time.Duration {
	if t == cp.TargetRemote {
		return rt.PredictedRemote
	}
	return rt.PredictedLocal
}

func predicted(rt *cp.RouteDecision, t cp.Target) string {
	if d := predictedOf(rt, t); d > 0 {
		return client.Duration(d)
	}
	return "unknown"
}

func otherTarget(t cp.Target) cp.Target {
	if t == cp.TargetRemote {
		return cp.TargetLocal
	}
	return cp.TargetRemote
}

// waitMeasured waits until the prefill worker's and the decode group's
// heartbeats carry compute terms fitted to their prefills (the warm-up's),
// and returns their rates.
func waitMeasured(ctx context.Context, c *cluster.Cluster) (pf, g cp.Rates, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nc, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "demo-registry")
	if err != nil {
		return pf, g, err
	}
	defer nc.Close()
	reg, err := cp.OpenRegistry(ctx, nc, registryConfig)
	if err != nil {
		return pf, g, err
	}
	ch, err := reg.Watch(ctx)
	if err != nil {
		return pf, g, err
	}
	for {
		select {
		case <-ctx.Done():
			return pf, g, fmt.Errorf("the workers' heartbeats carry no measured compute terms after the warm-up: %w", ctx.Err())
		case w, ok := <-ch:
			if !ok {
				return pf, g, errors.New("the worker registry's watch ended")
			}
			if w.Info == nil || w.Info.Rates.Compute == nil {
				continue
			}
			switch {
			case w.Info.Kind == cp.KindPrefill:
				pf = w.Info.Rates
			case w.Info.Kind == cp.KindDecode && w.Info.Rank == 0:
				g = w.Info.Rates
			}
			if pf.Compute != nil && g.Compute != nil && pf.Compute.Samples >= 2 && g.Compute.Samples >= 2 {
				return pf, g, nil
			}
		}
	}
}

// job runs one text prompt and tells its story.
func job(ctx context.Context, nc *nats.Conn, out io.Writer, title, prompt string, pol cp.Policy, maxTokens int) (*run, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	fmt.Fprintf(out, "\n== %s (%d characters, policy %s)\n", title, len(prompt), pol)
	streaming := false
	var first time.Time
	res, err := client.Run(ctx, nc, cp.SubmitRequest{Prompt: prompt, Sampling: cp.Sampling{MaxTokens: maxTokens}, Policy: pol}, client.Handlers{
		Event: func(ev cp.JobEvent) {
			if ev.State == cp.StateRouted {
				fmt.Fprintf(out, "routed %s\n  why: %s\n", client.Route(ev.Route), ev.Route.Reason)
			}
		},
		Token: func(t cp.TokenMsg) {
			if first.IsZero() && t.TokenID >= 0 {
				first = time.Now()
			}
			if !streaming {
				fmt.Fprint(out, "text: ")
				streaming = true
			}
			fmt.Fprint(out, client.Printable(t.Text))
		},
	})
	if streaming {
		fmt.Fprintln(out)
	}
	if err != nil {
		return nil, err
	}
	if err := res.Err(); err != nil {
		return nil, err
	}
	if res.Final.State != cp.StateDone || res.Final.Route == nil {
		return nil, errors.New(title + ": ended " + string(res.Final.State))
	}
	fmt.Fprintf(out, "job %s done: %d prompt tokens, %d generated (%s); where the time went:\n", res.JobID,
		res.Final.Timing.PromptTokens, len(res.Tokens), res.Finish)
	fmt.Fprint(out, client.Timing(res.Final.Timing, res.Final.Route.Target))
	r := &run{Result: res, title: title, ttft: first.Sub(res.Submitted)}
	fmt.Fprintf(out, "time to first token: predicted %s, measured %s\n", predicted(res.Final.Route, res.Final.Route.Target), client.Duration(r.ttft))
	return r, nil
}
