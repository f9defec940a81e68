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
	register(command{"api", "the OpenAI-compatible API: its overhead over a direct NATS submission to the first token, and concurrent streams", runAPIBench})
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

func runAPIBench(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("api", pflag.ContinueOnError)
	modelDir := fs.String("model", "", "checkpoint directory with a tokenizer (default: the synthetic demo preset, generated into the test-model cache if needed)")
	pairs := fs.Int("pairs", 200, "first-token measurements each way, interleaved")
	concurrent := fs.Int("concurrent", 200, "streamed requests at once in the second part (0: skip it)")
	limitP50 := fs.Duration("max-p50", 2*time.Millisecond, "limit on the API's overhead at p50")
	limitP99 := fs.Duration("max-p99", 10*time.Millisecond, "limit on the API's overhead at p99")
	asJSON := fs.Bool("json", false, "print one JSON object as the last line")
	verbose := fs.BoolP("v", "v", false, "log the services (to stderr)")
	apiBin := fs.String("api-bin", "", "a built coordinator binary: run the front door as its own `coordinator api` process (logged in as the client) and report its resident memory (Linux /proc); default: in this process")
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
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if *pairs < 10 {
		return fmt.Errorf("--pairs %d: want at least 10", *pairs)
	}
	log := zap.NewNop()
	if *verbose {
		log, _ = config.NewLogger("debug", "console", os.Stderr)
	}
	dir := *modelDir
	if dir == "" {
		var err error
		if dir, err = synth.Ensure(ctx, synth.CacheDir(), demo.Preset, 1, 2); err != nil {
			return err
		}
	}
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, Log: log, Queue: cp.QueueConfig{Memory: true},
		Registry:    cp.RegistryConfig{Memory: true, TTL: 3 * time.Second},
		Coordinator: service.Config{AssignTimeout: time.Minute}})
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Tokenizer == nil {
		return fmt.Errorf("model %s has no tokenizer", dir)
	}
	if err := c.WaitReady(ctx); err != nil {
		return err
	}
	nc, err := c.Connect(ctx, "bench-direct")
	if err != nil {
		return err
	}
	defer nc.Close()
	anc, err := c.Connect(ctx, "bench-api")
	if err != nil {
		return err
	}
	defer anc.Close()
	const name = "bench"
	var base string // http://host:port
	var apiProc *os.Process
	if *apiBin != "" {
		p, addr, err := startAPIProcess(ctx, *apiBin, dir, name, c, max(*concurrent, 1))
		if err != nil {
			return err
		}
		defer func() { _ = p.Kill(); _, _ = p.Wait() }()
		apiProc, base = p, "http://"+addr
	} else {
		srv, err := openai.New(openai.Config{Conn: anc, Model: c.Model, Tokenizer: c.Tokenizer, ModelName: name,
			MaxConcurrentPerKey: max(*concurrent, 1), Log: log})
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = srv.ServeListener(sctx, ln, nil) }()
		base = "http://" + ln.Addr().String()
	}
	url := base + "/v1/chat/completions"
	if err := waitHealthy(ctx, base+"/health"); err != nil {
		return err
	}

	msgs, ids, err := visiblePrompt(ctx, nc, c.Tokenizer)
	if err != nil {
		return err
	}
	eom := int32(c.Tokenizer.EndOfMessageID())
	direct := func() (time.Duration, error) {
		start := time.Now()
		var first time.Duration
		res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: ids, Sampling: cp.Sampling{MaxTokens: 1, Stop: cp.Stop{TokenIDs: []int32{eom}}}},
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
	body, _ := json.Marshal(map[string]any{"model": name, "messages": msgs, "max_tokens": 1, "temperature": 0, "stream": true})
	hc := &http.Client{}
	viaHTTP := func() (time.Duration, error) {
		start := time.Now()
		d, _, err := streamChat(ctx, hc, url, body, start)
		return d, err
	}
	for range 10 { // warm both paths
		if _, err := direct(); err != nil {
			return fmt.Errorf("warm-up, direct: %w", err)
		}
		if _, err := viaHTTP(); err != nil {
			return fmt.Errorf("warm-up, HTTP: %w", err)
		}
	}
	var ds, hs []time.Duration
	for i := range *pairs {
		for k := range 2 {
			if (k == 0) == (i%2 == 0) {
				d, err := direct()
				if err != nil {
					return fmt.Errorf("pair %d, direct: %w", i, err)
				}
				ds = append(ds, d)
			} else {
				d, err := viaHTTP()
				if err != nil {
					return fmt.Errorf("pair %d, HTTP: %w", i, err)
				}
				hs = append(hs, d)
			}
		}
	}
	rep := apiReport{Pairs: *pairs, LimitP50Ms: msOf(*limitP50), LimitP99Ms: msOf(*limitP99), APIProcess: apiProc != nil}
	if apiProc != nil {
		if rss, _, err := procMemory(apiProc.Pid); err == nil {
			rep.APIRSSIdleMB = rss
		} else {
			fmt.Fprintf(os.Stderr, "front door memory not measured: %v\n", err)
		}
	}
	rep.DirectP50Ms, rep.DirectP99Ms = msOf(quantile(ds, 0.5)), msOf(quantile(ds, 0.99))
	rep.HTTPP50Ms, rep.HTTPP99Ms = msOf(quantile(hs, 0.5)), msOf(quantile(hs, 0.99))
	rep.OverheadP50Ms, rep.OverheadP99Ms = rep.HTTPP50Ms-rep.DirectP50Ms, rep.HTTPP99Ms-rep.DirectP99Ms
	rep.Pass = rep.OverheadP50Ms <= rep.LimitP50Ms && rep.OverheadP99Ms <= rep.LimitP99Ms

	if n := *concurrent; n > 0 {
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
				b, _ := json.Marshal(map[string]any{"model": name, "max_tokens": 8, "stream": true, "seed": i,
					"stream_options": map[string]any{"include_usage": true},
					"messages":       []map[string]any{{"role": "user", "content": fmt.Sprintf("Request %d.", i)}}})
				_, tokens, err := streamChat(ctx, hc, url, b, time.Now())
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
		if apiProc != nil {
			if _, hwm, err := procMemory(apiProc.Pid); err == nil {
				rep.APIRSSPeakMB = hwm
			}
		}
	}

	fmt.Printf("time to first token, %d pairs interleaved (one-token greedy chat, %d prompt tokens):\n", rep.Pairs, len(ids))
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
	if *asJSON {
		b, _ := json.Marshal(rep)
		fmt.Println(string(b))
	}
	if !rep.Pass {
		return errors.New("over a limit")
	}
	return nil
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
