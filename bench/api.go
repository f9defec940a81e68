package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/demo"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/tokenizer"
)

func init() {
	register(command{"api", "the OpenAI-compatible API: its overhead over a direct NATS submission to the first token, and concurrent streams", stages(parseAPIFlags, runAPIBench)})
}

// apiReport is bench api's result.
type apiReport struct {
	Pairs           int     `json:"pairs"`
	DirectP50Ms     float64 `json:"direct_ttft_p50_ms"`
	DirectP99Ms     float64 `json:"direct_ttft_p99_ms"`
	HTTPP50Ms       float64 `json:"http_ttft_p50_ms"`
	HTTPP99Ms       float64 `json:"http_ttft_p99_ms"`
	OverheadP50Ms   float64 `json:"overhead_p50_ms"`
	OverheadP99Ms   float64 `json:"overhead_p99_ms"`
	LimitP50Ms      float64 `json:"limit_p50_ms"`
	LimitP99Ms      float64 `json:"limit_p99_ms"`
	Concurrent      int     `json:"concurrent"`
	Completed       int     `json:"completed"`
	ConcurrentSecs  float64 `json:"concurrent_s"`
	HeapPeakDeltaMB float64 `json:"heap_peak_delta_mib"`
	// With --api-bin: the front door's own process, its resident set
	// after the warm-up and its peak (VmHWM) by the end of the streams.
	APIProcess   bool    `json:"api_process"`
	APIRSSIdleMB float64 `json:"api_rss_idle_mib,omitempty"`
	APIRSSPeakMB float64 `json:"api_rss_peak_mib,omitempty"`
	Pass         bool    `json:"pass"`
}

// apiConfig is bench api's configuration, from its flags.
type apiConfig struct {
	modelDir           string
	pairs, concurrent  int
	limitP50, limitP99 time.Duration
	asJSON, verbose    bool
	apiBin             string
}

// parseAPIFlags parses bench api's command line. After --help it returns
// pflag.ErrHelp.
func parseAPIFlags(args []string) (apiConfig, error) {
	var f apiConfig
	fs := pflag.NewFlagSet("api", pflag.ContinueOnError)
	fs.StringVar(&f.modelDir, "model", "", "checkpoint directory with a tokenizer (default: the synthetic demo preset, generated into the test-model cache if needed)")
	fs.IntVar(&f.pairs, "pairs", 200, "first-token measurements each way, interleaved")
	fs.IntVar(&f.concurrent, "concurrent", 200, "streamed requests at once in the second part (0: skip it)")
	fs.DurationVar(&f.limitP50, "max-p50", 2*time.Millisecond, "limit on the API's overhead at p50")
	fs.DurationVar(&f.limitP99, "max-p99", 10*time.Millisecond, "limit on the API's overhead at p99")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object as the last line")
	fs.BoolVarP(&f.verbose, "v", "v", false, "log the services (to stderr)")
	fs.StringVar(&f.apiBin, "api-bin", "", "a built coordinator binary: run the front door as its own `coordinator api` process (logged in as the client) and report its resident memory (Linux /proc); default: in this process")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench api [flags]

Starts a deployment in this process (embedded NATS, coordinator, prefill
worker, 2-rank decode group, each on its own NATS connection) and the
OpenAI-compatible front door on loopback, then measures the time to the
first token of the same one-token greedy chat, interleaved: submitted
directly over NATS with coordinator/client (to its first token message),
and as a streamed POST /v1/chat/completions (to the first chunk carrying
text, read from the socket). The API's overhead at p50 and p99 is the
difference, checked against the limits. Then it sends --concurrent streamed
requests at once and counts those that end with [DONE] and their usage, with
the process's peak heap growth meanwhile (an upper bound on the front
door's: the workers' per-job state is in it too). With --api-bin the front
door is a coordinator api process of its own instead, and its resident set
(after the warm-up, and its peak) is the front door's memory alone.

`)
		fs.PrintDefaults()
	}
	return f, parseFlags(fs, args)
}

// validate checks the flags on their own.
func (f apiConfig) validate() error {
	if f.pairs < 10 {
		return fmt.Errorf("--pairs %d: want at least 10", f.pairs)
	}
	return nil
}

// apiModelName is the model name the front door serves.
const apiModelName = "bench"

func runAPIBench(ctx context.Context, f apiConfig) error {
	d, err := startAPIDeployment(ctx, f)
	defer d.close()
	if err != nil {
		return err
	}
	msgs, ids, err := visiblePrompt(ctx, d.nc, d.c.Tokenizer)
	if err != nil {
		return err
	}
	ds, hs, err := d.firstTokens(ctx, f.pairs, msgs, ids)
	if err != nil {
		return err
	}
	rep := apiReport{Pairs: f.pairs, LimitP50Ms: msOf(f.limitP50), LimitP99Ms: msOf(f.limitP99), APIProcess: d.proc != nil}
	if d.proc != nil {
		if rss, _, err := procMemory(d.proc.Pid); err == nil {
			rep.APIRSSIdleMB = rss
		} else {
			fmt.Fprintf(os.Stderr, "front door memory not measured: %v\n", err)
		}
	}
	rep.DirectP50Ms, rep.DirectP99Ms = msOf(quantile(ds, 0.5)), msOf(quantile(ds, 0.99))
	rep.HTTPP50Ms, rep.HTTPP99Ms = msOf(quantile(hs, 0.5)), msOf(quantile(hs, 0.99))
	rep.OverheadP50Ms, rep.OverheadP99Ms = rep.HTTPP50Ms-rep.DirectP50Ms, rep.HTTPP99Ms-rep.DirectP99Ms
	rep.Pass = rep.OverheadP50Ms <= rep.LimitP50Ms && rep.OverheadP99Ms <= rep.LimitP99Ms
	if f.concurrent > 0 {
		d.concurrentStreams(ctx, f.concurrent, &rep)
	}
	printAPIReport(&rep, len(ids))
	if f.asJSON {
		b, _ := json.Marshal(rep)
		fmt.Println(string(b))
	}
	if !rep.Pass {
		return errors.New("over a limit")
	}
	return nil
}

// apiDeployment is a deployment in this process with the front door on
// loopback: in this process, or a coordinator api process (proc).
type apiDeployment struct {
	c       *cluster.Cluster
	nc      *nats.Conn // the direct client's
	hc      *http.Client
	base    string // http://host:port
	url     string // the chat completions endpoint
	proc    *os.Process
	closers []func() // run in reverse by close
}

// startAPIDeployment starts the deployment and the front door of f and
// waits for them. The deployment must be closed, even on error.
func startAPIDeployment(ctx context.Context, f apiConfig) (*apiDeployment, error) {
	d := &apiDeployment{hc: &http.Client{}}
	log := zap.NewNop()
	if f.verbose {
		log, _ = config.NewLogger("debug", "console", os.Stderr)
	}
	dir := f.modelDir
	if dir == "" {
		var err error
		if dir, err = synth.Ensure(ctx, synth.CacheDir(), demo.Preset, 1, 2); err != nil {
			return d, err
		}
	}
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, Log: log, Queue: cp.QueueConfig{Memory: true},
		Registry:    cp.RegistryConfig{Memory: true, TTL: 3 * time.Second},
		Coordinator: service.Config{AssignTimeout: time.Minute}})
	if err != nil {
		return d, err
	}
	d.c = c
	d.closers = append(d.closers, func() { c.Close() })
	if c.Tokenizer == nil {
		return d, fmt.Errorf("model %s has no tokenizer", dir)
	}
	if err := c.WaitReady(ctx); err != nil {
		return d, err
	}
	if d.nc, err = c.Connect(ctx, "bench-direct"); err != nil {
		return d, err
	}
	d.closers = append(d.closers, d.nc.Close)
	if err := d.startFrontDoor(ctx, f, dir, log); err != nil {
		return d, err
	}
	d.url = d.base + "/v1/chat/completions"
	return d, waitHealthy(ctx, d.base+"/health")
}

// startFrontDoor starts the OpenAI-compatible API: a coordinator api
// process with --api-bin, else a server in this process on its own NATS
// connection.
func (d *apiDeployment) startFrontDoor(ctx context.Context, f apiConfig, dir string, log *zap.Logger) error {
	anc, err := d.c.Connect(ctx, "bench-api")
	if err != nil {
		return err
	}
	d.closers = append(d.closers, anc.Close)
	if f.apiBin != "" {
		p, addr, err := startAPIProcess(ctx, f.apiBin, dir, apiModelName, d.c, max(f.concurrent, 1))
		if err != nil {
			return err
		}
		d.closers = append(d.closers, func() { _ = p.Kill(); _, _ = p.Wait() })
		d.proc, d.base = p, "http://"+addr
		return nil
	}
	srv, err := openai.New(openai.Config{Conn: anc, Model: d.c.Model, Tokenizer: d.c.Tokenizer, ModelName: apiModelName,
		MaxConcurrentPerKey: max(f.concurrent, 1), Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	d.closers = append(d.closers, stop)
	go func() { _ = srv.ServeListener(sctx, ln, nil) }()
	d.base = "http://" + ln.Addr().String()
	return nil
}

// close stops what startAPIDeployment started, last first.
func (d *apiDeployment) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// firstTokens times the first token of the same one-token greedy chat
// pairs times each way, direct and over HTTP, interleaved, after warming
// both paths.
func (d *apiDeployment) firstTokens(ctx context.Context, pairs int, msgs []map[string]any, ids []int32) (ds, hs []time.Duration, err error) {
	eom := int32(d.c.Tokenizer.EndOfMessageID())
	direct := func() (time.Duration, error) {
		start := time.Now()
		var first time.Duration
		res, err := client.Run(ctx, d.nc, cp.SubmitRequest{TokenIDs: ids, Sampling: cp.Sampling{MaxTokens: 1, Stop: cp.Stop{TokenIDs: []int32{eom}}}},
			client.Handlers{Token: func(t cp.TokenMsg) {
				if first == 0 && t.TokenID >= 0 {
					first = time.Since(start)
				}
			}})
		if err == nil {
			err = res.Err()
		}
		if err == nil && first == 0 {
			err = errors.New("no token")
		}
		return first, err
	}
	body, _ := json.Marshal(map[string]any{"model": apiModelName, "messages": msgs, "max_tokens": 1, "temperature": 0, "stream": true})
	viaHTTP := func() (time.Duration, error) {
		start := time.Now()
		t, _, err := streamChat(ctx, d.hc, d.url, body, start)
		return t, err
	}
	for range 10 { // warm both paths
		if _, err := direct(); err != nil {
			return nil, nil, fmt.Errorf("warm-up, direct: %w", err)
		}
		if _, err := viaHTTP(); err != nil {
			return nil, nil, fmt.Errorf("warm-up, HTTP: %w", err)
		}
	}
	for i := range pairs {
		for k := range 2 {
			if (k == 0) == (i%2 == 0) {
				t, err := direct()
				if err != nil {
					return nil, nil, fmt.Errorf("pair %d, direct: %w", i, err)
				}
				ds = append(ds, t)
			} else {
				t, err := viaHTTP()
				if err != nil {
					return nil, nil, fmt.Errorf("pair %d, HTTP: %w", i, err)
				}
				hs = append(hs, t)
			}
		}
	}
	return ds, hs, nil
}

// concurrentStreams sends n streamed requests at once and records in rep
// those completed with usage, the time taken, this process's peak heap
// growth and, with a front door process, its peak resident set.
func (d *apiDeployment) concurrentStreams(ctx context.Context, n int, rep *apiReport) {
	rep.Concurrent = n
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	peak := before.HeapInuse
	done := make(chan struct{})
	go func() { // sample the heap while the streams run
		var m runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range n {
		wg.Go(func() {
			b, _ := json.Marshal(map[string]any{"model": apiModelName, "max_tokens": 8, "stream": true, "seed": i,
				"stream_options": map[string]any{"include_usage": true},
				"messages":       []map[string]any{{"role": "user", "content": fmt.Sprintf("Request %d.", i)}}})
			_, tokens, err := streamChat(ctx, d.hc, d.url, b, time.Now())
			if err == nil && tokens < 1 {
				err = errors.New("no usage")
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else {
				rep.Completed++
			}
		})
	}
	wg.Wait()
	close(done)
	rep.ConcurrentSecs = time.Since(start).Seconds()
	rep.HeapPeakDeltaMB = float64(peak-before.HeapInuse) / (1 << 20)
	if len(errs) > 0 {
		fmt.Fprintf(os.Stderr, "%d streams failed, the first: %v\n", len(errs), errs[0])
	}
	rep.Pass = rep.Pass && rep.Completed == n
	if d.proc != nil {
		if _, hwm, err := procMemory(d.proc.Pid); err == nil {
			rep.APIRSSPeakMB = hwm
		}
	}
}

// printAPIReport prints rep's tables; promptTokens is the chat's length.
func printAPIReport(rep *apiReport, promptTokens int) {
	fmt.Printf("time to first token, %d pairs interleaved (one-token greedy chat, %d prompt tokens):\n", rep.Pairs, promptTokens)
	fmt.Printf("  direct NATS (coordinator/client)   p50 %8.3f ms   p99 %8.3f ms\n", rep.DirectP50Ms, rep.DirectP99Ms)
	fmt.Printf("  HTTP API (streamed chat, loopback) p50 %8.3f ms   p99 %8.3f ms\n", rep.HTTPP50Ms, rep.HTTPP99Ms)
	fmt.Printf("  API overhead                       p50 %8.3f ms   p99 %8.3f ms   (limits %.0f / %.0f ms: %.2fx / %.2fx)\n",
		rep.OverheadP50Ms, rep.OverheadP99Ms, rep.LimitP50Ms, rep.LimitP99Ms, rep.OverheadP50Ms/rep.LimitP50Ms, rep.OverheadP99Ms/rep.LimitP99Ms)
	if rep.Concurrent > 0 {
		what := "workers included"
		if rep.APIProcess {
			what = "the deployment without the front door"
		}
		fmt.Printf("%d concurrent streams: %d completed with usage and [DONE] in %.1f s; this process's heap peak +%.1f MiB (%.0f KiB a stream, %s)\n",
			rep.Concurrent, rep.Completed, rep.ConcurrentSecs, rep.HeapPeakDeltaMB, rep.HeapPeakDeltaMB*1024/float64(rep.Concurrent), what)
	}
	if rep.APIProcess && rep.APIRSSPeakMB > 0 {
		fmt.Printf("front door alone (coordinator api process): resident %.1f MiB after the warm-up, peak %.1f MiB with %d streams (+%.0f KiB a stream)\n",
			rep.APIRSSIdleMB, rep.APIRSSPeakMB, rep.Concurrent, (rep.APIRSSPeakMB-rep.APIRSSIdleMB)*1024/float64(max(rep.Concurrent, 1)))
	}
}

// visiblePrompt finds a short chat whose greedy first token is text (not a
// special token or part of a character), so that the first token reaches
// an HTTP client as soon as it is generated.
func visiblePrompt(ctx context.Context, nc *nats.Conn, tok *tokenizer.Tokenizer) ([]map[string]any, []int32, error) {
	eom := int32(tok.EndOfMessageID())
	for i := range 50 {
		content := fmt.Sprintf("Question %d: why split prefill and decode?", i)
		raw, _ := json.Marshal(content)
		ids, err := tok.EncodeChat(&tokenizer.Chat{Messages: []tokenizer.ChatMessage{{Role: "user", Content: raw}}})
		if err != nil {
			return nil, nil, err
		}
		prompt := make([]int32, len(ids))
		for j, id := range ids {
			prompt[j] = int32(id)
		}
		res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: prompt, Sampling: cp.Sampling{MaxTokens: 1, Stop: cp.Stop{TokenIDs: []int32{eom}}}}, client.Handlers{})
		if err != nil {
			return nil, nil, err
		}
		if len(res.Tokens) == 1 && !tok.IsSpecial(int(res.Tokens[0])) {
			if text, _ := tokenizer.NewStreamDecoder(tok).Push(int(res.Tokens[0])); text != "" {
				return []map[string]any{{"role": "user", "content": content}}, prompt, nil
			}
		}
	}
	return nil, nil, errors.New("no prompt of 50 begins its reply with a visible token")
}

// streamChat posts a streamed chat and reads it to its end; it returns the
// time from start to the first chunk with text, and the completion tokens
// of the usage chunk (0 without one).
func streamChat(ctx context.Context, hc *http.Client, url string, body []byte, start time.Time) (time.Duration, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	var first time.Duration
	tokens, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if first == 0 && strings.Contains(data, `"content":"`) && !strings.Contains(data, `"content":""`) {
			first = time.Since(start)
		}
		var ch struct {
			Usage *struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil || ch.Error != nil {
			return 0, 0, fmt.Errorf("chunk %s: %v", data, err)
		}
		if ch.Usage != nil {
			tokens = ch.Usage.Completion
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if !done {
		return 0, 0, errors.New("the stream ended without [DONE]")
	}
	return first, tokens, nil
}

func waitHealthy(ctx context.Context, url string) error {
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy in 30s", url)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func msOf(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// startAPIProcess runs bin's `coordinator api` for model dir on the
// cluster's NATS, logged in as the deployment's client (its identity
// written to a private temporary file), and returns the process and its
// HTTP address once it serves.
func startAPIProcess(ctx context.Context, bin, dir, name string, c *cluster.Cluster, maxConcurrent int) (*os.Process, string, error) {
	id := cp.Find(c.Identities(), cp.PrincipalClient)
	if id == nil {
		return nil, "", errors.New("api process: the deployment has no client identity")
	}
	tmp, err := os.MkdirTemp("", "bench-api-")
	if err != nil {
		return nil, "", err
	}
	creds := filepath.Join(tmp, "client.json")
	if err := cp.SaveIdentity(creds, id); err != nil {
		return nil, "", err
	}
	cmd := exec.CommandContext(ctx, bin, "api", "--model", dir, "--nats-url", c.URL, "--nats-credentials", creds,
		"--http-listen", "127.0.0.1:0", "--http-model-name", name, "--http-max-concurrent-per-key", fmt.Sprint(maxConcurrent),
		"--log-format", "json", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("api process: %w", err)
	}
	addr := make(chan string, 1)
	go func() {
		defer os.RemoveAll(tmp)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, URL string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "OpenAI-compatible API" {
				select {
				case addr <- strings.TrimSuffix(strings.TrimPrefix(line.URL, "http://"), "/v1"):
				default:
				}
			}
		}
	}()
	select {
	case a := <-addr:
		return cmd.Process, a, nil
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		return nil, "", errors.New("api process: not serving after 1 minute")
	}
}

// procMemory is a process's resident set and its peak (VmRSS, VmHWM) in
// MiB, from Linux's /proc.
func procMemory(pid int) (rss, hwm float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("resident memory: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb float64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			if _, err := fmt.Sscanf(strings.TrimPrefix(line, "VmRSS:"), "%f", &kb); err == nil {
				rss = kb / 1024
			}
		case strings.HasPrefix(line, "VmHWM:"):
			if _, err := fmt.Sscanf(strings.TrimPrefix(line, "VmHWM:"), "%f", &kb); err == nil {
				hwm = kb / 1024
			}
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("resident memory: no VmRSS/VmHWM in /proc/%d/status", pid)
	}
	return rss, hwm, nil
}
