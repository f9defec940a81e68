package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/faultproxy"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/model"
)

func init() {
	register(command{name: "transfer", short: "kvtransfer throughput, exposed tail, overlap and corruption checks on loopback", run: runTransfer})
}

type transferFlags struct {
	model         string
	tokens        int
	ranks         int
	conns         int
	chunk         int
	window        int
	reps          int
	prefillMS     float64
	rateMBs       float64
	limitedLayers int
	faults        bool
	seed          uint64
	asJSON        bool
	transport     string
	loss          float64
	slotSize      int
	slots         int
	cpuProfile    string
}

// transferResult is the JSON line. Throughputs are in Gbit/s.
type transferResult struct {
	Model        string `json:"model"`
	Tokens       int    `json:"tokens"`
	Layers       int    `json:"layers"`
	StateBytes   int64  `json:"state_bytes"`
	Ranks        int    `json:"ranks"`
	ConnsPerRank int    `json:"conns_per_rank"`
	ChunkBytes   int    `json:"chunk_bytes"`
	Reps         int    `json:"reps"`
	CPUs         int    `json:"cpus"`

	RawTCPGbps    float64 `json:"raw_tcp_gbps"`
	TransferGbps  float64 `json:"transfer_gbps"`
	TransferRatio float64 `json:"transfer_vs_raw"`
	TargetRatio   float64 `json:"target_ratio"`
	ThroughputOK  bool    `json:"throughput_ok"`

	PrefillMSPerLayer float64 `json:"prefill_ms_per_layer"`
	ExposedTailMS     float64 `json:"exposed_tail_ms"`
	LastLayerSendMS   float64 `json:"last_layer_send_ms"`
	TailLimitMS       float64 `json:"tail_limit_ms"`
	TailOK            bool    `json:"tail_ok"`

	ChunksVerified         int64 `json:"chunks_verified"`
	CorruptChunksCommitted int64 `json:"corrupt_chunks_committed"`
	FaultFlips             int64 `json:"fault_flips"`
	FaultCuts              int64 `json:"fault_cuts"`
	FaultCRCFailures       int64 `json:"fault_crc_failures_detected"`
	FaultTransferOK        bool  `json:"fault_transfer_ok"`

	LimitedRateMBs     float64 `json:"limited_rate_mbs"`
	LimitedLayers      int     `json:"limited_layers"`
	LimitedBytes       int64   `json:"limited_bytes"`
	LimitedPrefillMS   float64 `json:"limited_prefill_ms"`
	LimitedTransferMS  float64 `json:"limited_transfer_ms"`
	LimitedE2EMS       float64 `json:"limited_e2e_ms"`
	LimitedSumMS       float64 `json:"limited_sum_ms"`
	LimitedOverlap     float64 `json:"limited_e2e_vs_max"`
	LimitedOverlapOK   bool    `json:"limited_overlap_ok"`
	CorruptCheckPassed bool    `json:"corrupt_check_ok"`
}

func runTransfer(ctx context.Context, args []string) error {
	var f transferFlags
	fs := pflag.NewFlagSet("transfer", pflag.ContinueOnError)
	fs.StringVar(&f.model, "model", "k3", "state shapes: k3 (the released config), a preset (tiny, small, medium) or a config.json path")
	fs.IntVar(&f.tokens, "tokens", 4096, "cached tokens T of the sequence (MLA rows per MLA layer)")
	fs.IntVar(&f.ranks, "ranks", 2, "decode ranks (servers), layers split contiguously")
	fs.IntVar(&f.conns, "conns", 2, "connections per rank")
	fs.IntVar(&f.chunk, "chunk", kvtransfer.DefaultChunkSize, "chunk size in bytes")
	fs.IntVar(&f.window, "window", kvtransfer.DefaultWindow, "credit window (chunks in flight per connection)")
	fs.IntVar(&f.reps, "reps", 5, "repetitions of each timed run (the best is reported)")
	fs.Float64Var(&f.prefillMS, "prefill-ms", 0, "simulated prefill time per layer in the streaming run (0: twice the layer's measured send time)")
	fs.Float64Var(&f.rateMBs, "rate", 100, "link rate in MB/s of the rate-limited overlap run (0 skips it)")
	fs.IntVar(&f.limitedLayers, "limited-layers", 8, "layers streamed in the rate-limited run")
	fs.BoolVar(&f.faults, "faults", true, "also stream through a proxy that flips bits and cuts connections")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random state bytes")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object as the last line")
	fs.StringVar(&f.transport, "transport", "tcp", "tcp, or rdma-fake: the RDMA link over the in-process fake verbs wire, compared with that wire without the link")
	fs.Float64Var(&f.loss, "loss", 0, "with --transport rdma-fake: the probability that the wire loses a message")
	fs.IntVar(&f.slotSize, "slot-size", rdma.DefaultSlotSize, "with --transport rdma-fake: bytes per slot of the link (and of the bare wire)")
	fs.IntVar(&f.slots, "slots", rdma.DefaultSlots, "with --transport rdma-fake: slots per ring")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "with --transport rdma-fake: write a CPU profile of the timed runs (raw wire and link alike) to this file")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench transfer [flags]

Streams a sequence's decode state (random bytes in the model's real shapes)
through kvtransfer on loopback and compares it with plain TCP in the same run:
throughput with checksums on (target >= 0.8 x raw TCP), the exposed tail after
the last layer of a paced prefill (target <= the last layer's own send time +
10 ms), corruption (a bit-flipping, connection-cutting proxy; no corrupt chunk
may be committed) and, on a rate-limited link, the overlap of prefill and
transfer (end to end about max(prefill, transfer), not their sum).

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if f.tokens < 0 || f.ranks < 1 || f.conns < 1 || f.reps < 1 || f.limitedLayers < 1 {
		return fmt.Errorf("--tokens, --ranks, --conns, --reps and --limited-layers must be positive")
	}
	cfg, err := transferConfig(f.model)
	if err != nil {
		return err
	}
	if f.ranks > cfg.NumLayers {
		return fmt.Errorf("--ranks %d exceeds the model's %d layers", f.ranks, cfg.NumLayers)
	}
	all := kvtest.AllLayers(cfg.NumLayers)
	src := kvtest.RandomSeq(cfg, all, f.tokens, model.BF16, f.seed)
	switch f.transport {
	case "tcp":
	case "rdma-fake":
		return transferRDMAFake(ctx, f, cfg, src)
	default:
		return fmt.Errorf("--transport %q: want tcp or rdma-fake", f.transport)
	}
	res := transferResult{Model: f.model, Tokens: f.tokens, Layers: cfg.NumLayers, StateBytes: int64(src.Bytes()),
		Ranks: f.ranks, ConnsPerRank: f.conns, ChunkBytes: f.chunk, Reps: f.reps, CPUs: runtime.NumCPU(), TargetRatio: 0.8}
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	say("state: %s, T=%d, %d layers, %.1f MB; %d ranks x %d connections, %d-byte chunks",
		f.model, f.tokens, cfg.NumLayers, float64(res.StateBytes)/1e6, f.ranks, f.conns, f.chunk)

	g, err := startGroup(cfg, f.ranks, f.chunk, f.window)
	if err != nil {
		return err
	}
	defer g.close()
	var corrupt, verified int64
	tally := func(t xferTiming) {
		corrupt += t.corrupt
		verified += t.chunks
	}

	// Raw TCP (over one connection and over as many as the transfer uses;
	// the faster counts) and full-speed transfer, interleaved so that both
	// see the same machine load and get as many timed samples; best of each.
	var rawBest, xferBest time.Duration
	for rep := 0; rep < f.reps; rep++ {
		for _, n := range []int{1, f.ranks * f.conns} {
			d, err := rawTCP(ctx, src, all, n)
			if err != nil {
				return fmt.Errorf("raw TCP: %w", err)
			}
			if rawBest == 0 || d < rawBest {
				rawBest = d
			}
			t, err := g.run(ctx, src, all, f.conns, nil, nil)
			if err != nil {
				return fmt.Errorf("transfer: %w", err)
			}
			tally(t)
			if xferBest == 0 || t.total < xferBest {
				xferBest = t.total
			}
		}
	}
	res.RawTCPGbps = gbps(res.StateBytes, rawBest)
	res.TransferGbps = gbps(res.StateBytes, xferBest)
	res.TransferRatio = res.TransferGbps / res.RawTCPGbps
	res.ThroughputOK = res.TransferRatio >= res.TargetRatio
	say("raw TCP %.2f Gbit/s, transfer %.2f Gbit/s with CRC-32C: %.2f x raw (target >= %.1f)",
		res.RawTCPGbps, res.TransferGbps, res.TransferRatio, res.TargetRatio)

	// The last layer alone on an idle, connected link.
	last := cfg.NumLayers - 1
	var lastBest time.Duration
	for rep := 0; rep < f.reps; rep++ {
		t, err := g.run(ctx, src, []int{last}, f.conns, nil, nil)
		if err != nil {
			return fmt.Errorf("last layer alone: %w", err)
		}
		tally(t)
		if lastBest == 0 || t.total < lastBest {
			lastBest = t.total
		}
	}
	res.LastLayerSendMS = ms(lastBest)
	res.TailLimitMS = res.LastLayerSendMS + 10

	// A paced prefill: each layer handed over after its simulated compute.
	perByte := float64(xferBest) / float64(res.StateBytes)
	pace := func(L int) time.Duration {
		if f.prefillMS > 0 {
			return time.Duration(f.prefillMS * float64(time.Millisecond))
		}
		return time.Duration(2 * perByte * float64(src.Layers[L].Bytes()))
	}
	res.PrefillMSPerLayer = ms(time.Duration(float64(xferBest)*2) / time.Duration(cfg.NumLayers))
	if f.prefillMS > 0 {
		res.PrefillMSPerLayer = f.prefillMS
	}
	var tailBest time.Duration
	for rep := 0; rep < f.reps; rep++ {
		t, err := g.run(ctx, src, all, f.conns, pace, nil)
		if err != nil {
			return fmt.Errorf("streaming: %w", err)
		}
		tally(t)
		if tailBest == 0 || t.tail < tailBest {
			tailBest = t.tail
		}
	}
	res.ExposedTailMS = ms(tailBest)
	res.TailOK = res.ExposedTailMS <= res.TailLimitMS
	say("streaming with prefill paced at ~%.1f ms/layer: exposed tail %.1f ms; the last layer alone takes %.1f ms (limit %.1f ms)",
		res.PrefillMSPerLayer, res.ExposedTailMS, res.LastLayerSendMS, res.TailLimitMS)

	if f.faults {
		// About 40 flipped bits and 8 cuts over the state, whatever its size.
		ps, via, err := g.proxies(faultproxy.Faults{FlipEvery: max(res.StateBytes/40, 1), CutEvery: max(res.StateBytes/8, 1),
			MaxFaults: 60}, f.seed)
		if err != nil {
			return err
		}
		t, err := g.run(ctx, src, all, f.conns, nil, via)
		for _, p := range ps {
			st := p.Stats()
			res.FaultFlips += st.Flips
			res.FaultCuts += st.Cuts
			p.Close()
		}
		res.FaultCRCFailures = g.checksumFailures()
		res.FaultTransferOK = err == nil
		if err == nil {
			tally(t)
		}
		say("through a faulty proxy: %d bits flipped, %d connections cut, %d chunks failed their CRC and were resent; transfer ok: %v (%v)",
			res.FaultFlips, res.FaultCuts, res.FaultCRCFailures, res.FaultTransferOK, err)
	}
	res.ChunksVerified, res.CorruptChunksCommitted = verified, corrupt
	res.CorruptCheckPassed = corrupt == 0

	if f.rateMBs > 0 {
		if err := limitedRun(ctx, cfg, src, f, &res); err != nil {
			return fmt.Errorf("rate-limited run: %w", err)
		}
		say("at %.0f MB/s over %d layers (%.1f MB): prefill %.0f ms, transfer %.0f ms, end to end %.0f ms = %.2f x max (their sum: %.0f ms)",
			res.LimitedRateMBs, res.LimitedLayers, float64(res.LimitedBytes)/1e6, res.LimitedPrefillMS, res.LimitedTransferMS,
			res.LimitedE2EMS, res.LimitedOverlap, res.LimitedSumMS)
	}
	say("committed %d chunks, %d corrupt", res.ChunksVerified, res.CorruptChunksCommitted)
	if f.asJSON {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Println(string(b))
	}
	return nil
}

func transferConfig(name string) (*model.Config, error) {
	if _, err := os.Stat(name); err == nil {
		return model.LoadConfig(name)
	}
	return kvtest.Config(name)
}

func gbps(n int64, d time.Duration) float64 { return float64(n) * 8 / d.Seconds() / 1e9 }
func ms(d time.Duration) float64            { return float64(d.Microseconds()) / 1000 }

// xferGroup is a decode group on loopback: a server per rank.
type xferGroup struct {
	cfg     *model.Config
	servers []*kvtransfer.Server
	place   kvtransfer.LayerMap
	n       int
	client  kvtransfer.Transport // the sender's (nil: TCP)
}

func startGroup(cfg *model.Config, ranks, chunk, window int) (*xferGroup, error) {
	return startGroupOn(cfg, ranks, chunk, window, nil, nil)
}

// startGroupOn is startGroup with rank i listening on server(i) and the
// sender dialing with client (both TCP when nil).
func startGroupOn(cfg *model.Config, ranks, chunk, window int, server func(int) kvtransfer.Transport, client kvtransfer.Transport) (*xferGroup, error) {
	g := &xferGroup{cfg: cfg, client: client}
	var eps []string
	for i := 0; i < ranks; i++ {
		var tr kvtransfer.Transport
		if server != nil {
			tr = server(i)
		}
		srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: "127.0.0.1:0", ChunkSize: chunk, Window: window, Transport: tr})
		if err != nil {
			g.close()
			return nil, err
		}
		g.servers = append(g.servers, srv)
		eps = append(eps, srv.Addr())
	}
	var err error
	if g.place, err = kvtransfer.Contiguous(cfg.NumLayers, eps); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

func (g *xferGroup) close() {
	for _, s := range g.servers {
		s.Close()
	}
}

func (g *xferGroup) checksumFailures() int64 {
	var n int64
	for _, s := range g.servers {
		n += s.Stats().ChecksumFailures
	}
	return n
}

// proxies starts a fault proxy per rank and returns the endpoint mapping.
func (g *xferGroup) proxies(f faultproxy.Faults, seed uint64) ([]*faultproxy.Proxy, map[string]string, error) {
	var ps []*faultproxy.Proxy
	via := map[string]string{}
	for i, s := range g.servers {
		p, err := faultproxy.Start(faultproxy.Config{Target: s.Addr(), Faults: f, Seed: seed + uint64(i)})
		if err != nil {
			for _, q := range ps {
				q.Close()
			}
			return nil, nil, err
		}
		ps = append(ps, p)
		via[s.Addr()] = p.Addr()
	}
	return ps, via, nil
}

// xferTiming is one run's outcome.
type xferTiming struct {
	total   time.Duration // first hand-over to the last commit
	tail    time.Duration // last hand-over to the last commit
	chunks  int64         // chunks compared
	corrupt int64         // committed chunks that differ from the source
	cpu     cpuSpan       // CPU spent from the first hand-over to the last commit
}

// run streams the given layers of src to the ranks that own them (through
// the via endpoints when set), handing each layer over after pace(L) when
// pace is set, and checks every committed chunk against the source.
func (g *xferGroup) run(ctx context.Context, src *model.SeqState, layers []int, conns int, pace func(int) time.Duration, via map[string]string) (xferTiming, error) {
	defer func() {
		runtime.GC()
		debug.FreeOSMemory()
	}()
	g.n++
	sid := fmt.Sprintf("bench-%d", g.n)
	secret := []byte("bench-transfer-secret-0123456789")
	deadline := time.Now().Add(5 * time.Minute)
	place := kvtransfer.LayerMap{}
	type rank struct {
		in     *kvtransfer.Incoming
		layers []int
	}
	var ranks []rank
	for _, s := range g.servers {
		var own []int
		for _, L := range layers {
			if g.place[L] == s.Addr() {
				own = append(own, L)
				place[L] = s.Addr()
				if via != nil {
					place[L] = via[s.Addr()]
				}
			}
		}
		if len(own) == 0 {
			continue
		}
		in, err := s.Expect(kvtransfer.ExpectSpec{Session: sid, Secret: secret, Model: g.cfg, Layers: own, Tokens: src.Tokens, Deadline: deadline})
		if err != nil {
			return xferTiming{}, err
		}
		defer in.Cancel()
		ranks = append(ranks, rank{in, own})
	}
	snd, err := kvtransfer.NewSender(kvtransfer.SenderConfig{Session: sid, Secret: secret, Placement: place, Conns: conns, Deadline: deadline,
		Transport: g.client})
	if err != nil {
		return xferTiming{}, err
	}
	// Time the streaming, not the handshakes (the raw TCP baseline does
	// not count its dials either).
	for snd.Stats().Dials < int64(conns*len(ranks)) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			snd.Abort(errors.New("bench: connections not established"))
			return xferTiming{}, errors.New("connections not established")
		}
		time.Sleep(time.Millisecond)
	}
	var (
		mu      sync.Mutex
		lastEnd time.Time
		werr    error
		wg      sync.WaitGroup
		states  = make([]*model.SeqState, len(ranks))
	)
	for i, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := r.in.Wait(ctx)
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				werr = errors.Join(werr, err)
				return
			}
			if now.After(lastEnd) {
				lastEnd = now
			}
			states[i] = st
		}()
	}
	start, lm := time.Now(), startLoad()
	var lastPut time.Time
	for _, L := range layers {
		if pace != nil {
			time.Sleep(pace(L))
		}
		lastPut = time.Now()
		if err := snd.PutLayer(ctx, src.Layers[L]); err != nil {
			snd.Abort(err)
			wg.Wait()
			return xferTiming{}, err
		}
	}
	if err := snd.Close(ctx, src.Tokens); err != nil {
		wg.Wait()
		return xferTiming{}, err
	}
	wg.Wait()
	cpu := lm.span()
	if werr != nil {
		return xferTiming{}, werr
	}
	// Verify after the clock stopped, so that checking one rank does not
	// slow another still receiving.
	out := xferTiming{total: lastEnd.Sub(start), tail: lastEnd.Sub(lastPut), cpu: cpu}
	for i, r := range ranks {
		n, bad := compareChunks(src, states[i], r.layers)
		out.chunks += n
		out.corrupt += bad
	}
	return out, nil
}

// compareChunks counts the chunks (on a 1 MiB grid) of the committed layers
// and those that differ from the source.
func compareChunks(src, got *model.SeqState, layers []int) (n, bad int64) {
	const grid = 1 << 20
	for _, L := range layers {
		for i := range src.Layers[L].Parts {
			sp := &src.Layers[L].Parts[i]
			var gp *model.Part
			if got != nil && got.Layers[L] != nil {
				gp = got.Layers[L].Part(sp.Kind)
			}
			for off := 0; off < len(sp.Data); off += grid {
				end := min(off+grid, len(sp.Data))
				n++
				if gp == nil || len(gp.Data) != len(sp.Data) || !bytes.Equal(gp.Data[off:end], sp.Data[off:end]) {
					bad++
				}
			}
		}
	}
	return n, bad
}

// rawTCP sends the layers' bytes over conns plain loopback TCP connections
// (parts dealt round-robin) into freshly allocated buffers of the same sizes,
// kept until the end as a receiver keeps its state, and returns the time
// from the first write to the last byte read.
func rawTCP(ctx context.Context, src *model.SeqState, layers []int, conns int) (time.Duration, error) {
	defer func() {
		runtime.GC()
		debug.FreeOSMemory()
	}()
	var parts [][]byte
	for _, L := range layers {
		for _, p := range src.Layers[L].Parts {
			parts = append(parts, p.Data)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	mine := func(i int) [][]byte {
		var out [][]byte
		for j := i; j < len(parts); j += conns {
			out = append(out, parts[j])
		}
		return out
	}
	type recv struct {
		end time.Time
		err error
	}
	done := make(chan recv, conns)
	var readers sync.WaitGroup
	clients := make([]net.Conn, conns)
	for i := 0; i < conns; i++ {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return 0, err
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			return 0, err
		}
		defer s.Close()
		c.Write([]byte{byte(i)})
		var id [1]byte
		if _, err := io.ReadFull(s, id[:]); err != nil {
			return 0, err
		}
		clients[i] = c
		readers.Add(1)
		var dsts [][]byte
		for _, p := range mine(int(id[0])) {
			dst := make([]byte, len(p))
			for i := 0; i < len(dst); i += os.Getpagesize() {
				dst[i] = 0 // fault the pages in before the clock starts, as the kvtransfer receiver does
			}
			dsts = append(dsts, dst)
		}
		go func(s net.Conn, dsts [][]byte) {
			defer readers.Done()
			for _, dst := range dsts {
				if _, err := io.ReadFull(s, dst); err != nil {
					done <- recv{err: err}
					return
				}
			}
			done <- recv{end: time.Now()}
		}(s, dsts)
	}
	start := time.Now()
	var writers sync.WaitGroup
	werrs := make(chan error, conns)
	for i, c := range clients {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for _, p := range mine(i) {
				if _, err := c.Write(p); err != nil {
					werrs <- err
					return
				}
			}
		}()
	}
	writers.Wait()
	readers.Wait()
	close(done)
	close(werrs)
	if err := <-werrs; err != nil {
		return 0, err
	}
	var end time.Time
	for r := range done {
		if r.err != nil {
			return 0, r.err
		}
		if r.end.After(end) {
			end = r.end
		}
	}
	return end.Sub(start), nil
}

// limitedRun shows the overlap on a rate-limited link: one rank behind a
// proxy at the given rate, a prefill whose per-layer compute takes as long as
// that layer's transfer (the case where overlap matters most).
func limitedRun(ctx context.Context, cfg *model.Config, src *model.SeqState, f transferFlags, res *transferResult) error {
	n := min(f.limitedLayers, cfg.NumLayers)
	layers := kvtest.AllLayers(n)
	g, err := startGroup(cfg, 1, f.chunk, f.window)
	if err != nil {
		return err
	}
	defer g.close()
	rate := f.rateMBs * 1e6
	ps, via, err := g.proxies(faultproxy.Faults{Rate: int64(rate)}, f.seed)
	if err != nil {
		return err
	}
	defer ps[0].Close()
	var bytes int64
	for _, L := range layers {
		bytes += int64(src.Layers[L].Bytes())
	}
	pace := func(L int) time.Duration {
		return time.Duration(float64(src.Layers[L].Bytes()) / rate * float64(time.Second))
	}
	var prefill time.Duration
	for _, L := range layers {
		prefill += pace(L)
	}
	alone, err := g.run(ctx, src, layers, f.conns, nil, via)
	if err != nil {
		return err
	}
	e2e, err := g.run(ctx, src, layers, f.conns, pace, via)
	if err != nil {
		return err
	}
	if alone.corrupt+e2e.corrupt != 0 {
		res.CorruptChunksCommitted += alone.corrupt + e2e.corrupt
		res.CorruptCheckPassed = false
	}
	res.LimitedRateMBs = f.rateMBs
	res.LimitedLayers = n
	res.LimitedBytes = bytes
	res.LimitedPrefillMS = ms(prefill)
	res.LimitedTransferMS = ms(alone.total)
	res.LimitedE2EMS = ms(e2e.total)
	res.LimitedSumMS = res.LimitedPrefillMS + res.LimitedTransferMS
	res.LimitedOverlap = res.LimitedE2EMS / max(res.LimitedPrefillMS, res.LimitedTransferMS)
	res.LimitedOverlapOK = res.LimitedE2EMS < 0.75*res.LimitedSumMS
	return nil
}
