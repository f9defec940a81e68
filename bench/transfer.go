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
	"slices"
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
	register(command{name: "transfer", short: "kvtransfer throughput, exposed tail, overlap and corruption checks on loopback", run: stages(parseTransferFlags, runTransfer)})
}

// transferConfig is bench transfer's configuration, from its flags.
type transferConfig struct {
	model         string
	tokens        int
	ranks         int
	tensor        int
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
	WireBytes    int64  `json:"wire_bytes"` // received by the ranks: the state, plus the MLA rows again per extra tensor rank
	Ranks        int    `json:"ranks"`
	Tensor       int    `json:"tensor"`
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

// parseTransferFlags parses bench transfer's command line. After --help it
// returns pflag.ErrHelp.
func parseTransferFlags(args []string) (transferConfig, error) {
	var f transferConfig
	fs := pflag.NewFlagSet("transfer", pflag.ContinueOnError)
	fs.StringVar(&f.model, "model", "k3", "state shapes: k3 (the released config), a preset (tiny, small, medium) or a config.json path")
	fs.IntVar(&f.tokens, "tokens", 4096, "cached tokens T of the sequence (MLA rows per MLA layer)")
	fs.IntVar(&f.ranks, "ranks", 2, "decode ranks (servers), layers split contiguously over ranks/tensor stages")
	fs.IntVar(&f.tensor, "tensor", 1, "tensor ranks per stage: each gets its slice of the stage's layers (its KDA heads, the MLA rows whole); throughputs count the bytes on the wire")
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
	return f, parseFlags(fs, args)
}

// validate checks the flags on their own; --ranks against the model's
// layers is checked once the model is loaded.
func (f transferConfig) validate() error {
	if f.tokens < 0 || f.ranks < 1 || f.conns < 1 || f.reps < 1 || f.limitedLayers < 1 {
		return fmt.Errorf("--tokens, --ranks, --conns, --reps and --limited-layers must be positive")
	}
	if f.tensor < 1 || f.ranks%f.tensor != 0 {
		return fmt.Errorf("--tensor %d: want a positive divisor of --ranks %d (the ranks are stages x tensor)", f.tensor, f.ranks)
	}
	if f.tensor > 1 && f.transport != "tcp" {
		return fmt.Errorf("--tensor %d: tensor ranks are measured over --transport tcp only", f.tensor)
	}
	switch f.transport {
	case "tcp":
	case "rdma-fake":
		if f.loss < 0 || f.loss >= 1 {
			return fmt.Errorf("--loss %v: want a probability in [0, 1)", f.loss)
		}
	default:
		return fmt.Errorf("--transport %q: want tcp or rdma-fake", f.transport)
	}
	return nil
}

func runTransfer(ctx context.Context, f transferConfig) error {
	cfg, err := loadTransferModel(f.model)
	if err != nil {
		return err
	}
	if f.ranks/f.tensor > cfg.NumLayers {
		return fmt.Errorf("--ranks %d make %d stages, more than the model's %d layers", f.ranks, f.ranks/f.tensor, cfg.NumLayers)
	}
	if err := cfg.CheckShard(f.tensor); err != nil {
		return fmt.Errorf("--tensor: %w", err)
	}
	src := kvtest.RandomSeq(cfg, kvtest.AllLayers(cfg.NumLayers), f.tokens, model.BF16, f.seed)
	if f.transport == "rdma-fake" {
		return transferRDMAFake(ctx, f, cfg, src)
	}
	return transferTCP(ctx, f, cfg, src)
}

// tcpBench is one bench transfer run over TCP: the group it streams to and
// what it has measured.
type tcpBench struct {
	f                *transferConfig
	cfg              *model.Config
	src              *model.SeqState
	all              []int // every layer
	g                *xferGroup
	res              transferResult
	corrupt, checked int64 // chunks committed corrupt, and compared
	xferBest         time.Duration
}

// transferTCP measures throughput, the exposed tail, corruption and
// overlap over TCP, printing as it goes and the JSON line with --json.
func transferTCP(ctx context.Context, f transferConfig, cfg *model.Config, src *model.SeqState) error {
	b := &tcpBench{f: &f, cfg: cfg, src: src, all: kvtest.AllLayers(cfg.NumLayers)}
	b.res = transferResult{Model: f.model, Tokens: f.tokens, Layers: cfg.NumLayers, StateBytes: int64(src.Bytes()),
		Ranks: f.ranks, Tensor: f.tensor, ConnsPerRank: f.conns, ChunkBytes: f.chunk, Reps: f.reps, CPUs: runtime.NumCPU(), TargetRatio: 0.8}
	res := &b.res
	var err error
	if b.g, err = startGroup(cfg, f.ranks, f.chunk, f.window); err != nil {
		return err
	}
	defer b.g.close()
	if err := b.g.split(f.tensor); err != nil {
		return err
	}
	if res.WireBytes, err = b.g.wireBytes(src, b.all); err != nil {
		return err
	}
	say("state: %s, T=%d, %d layers, %.1f MB (%.1f MB on the wire); %d ranks (%d per stage) x %d connections, %d-byte chunks",
		f.model, f.tokens, cfg.NumLayers, float64(res.StateBytes)/1e6, float64(res.WireBytes)/1e6, f.ranks, f.tensor, f.conns, f.chunk)
	for _, step := range []func(context.Context) error{b.throughput, b.lastLayer, b.pacedTail} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	if f.faults {
		if err := b.faultyProxy(ctx); err != nil {
			return err
		}
	}
	res.ChunksVerified, res.CorruptChunksCommitted = b.checked, b.corrupt
	res.CorruptCheckPassed = b.corrupt == 0
	if f.rateMBs > 0 {
		if err := limitedRun(ctx, cfg, src, f, res); err != nil {
			return fmt.Errorf("rate-limited run: %w", err)
		}
		say("at %.0f MB/s over %d layers (%.1f MB): prefill %.0f ms, transfer %.0f ms, end to end %.0f ms = %.2f x max (their sum: %.0f ms)",
			res.LimitedRateMBs, res.LimitedLayers, float64(res.LimitedBytes)/1e6, res.LimitedPrefillMS, res.LimitedTransferMS,
			res.LimitedE2EMS, res.LimitedOverlap, res.LimitedSumMS)
	}
	say("committed %d chunks, %d corrupt", res.ChunksVerified, res.CorruptChunksCommitted)
	if f.asJSON {
		return printJSON(res)
	}
	return nil
}

// printJSON prints v as one line of JSON.
func printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// tally counts a run's compared and corrupt chunks.
func (b *tcpBench) tally(t xferTiming) {
	b.corrupt += t.corrupt
	b.checked += t.chunks
}

// throughput times raw TCP (over one connection and over as many as the
// transfer uses; the faster counts) and full-speed transfer, interleaved so
// that both see the same machine load and get as many timed samples; best
// of each.
func (b *tcpBench) throughput(ctx context.Context) error {
	f, res := b.f, &b.res
	var rawBest time.Duration
	for rep := 0; rep < f.reps; rep++ {
		for _, n := range []int{1, f.ranks * f.conns} {
			d, err := rawTCP(ctx, b.src, b.all, n)
			if err != nil {
				return fmt.Errorf("raw TCP: %w", err)
			}
			if rawBest == 0 || d < rawBest {
				rawBest = d
			}
			t, err := b.g.run(ctx, b.src, b.all, f.conns, nil, nil)
			if err != nil {
				return fmt.Errorf("transfer: %w", err)
			}
			b.tally(t)
			if b.xferBest == 0 || t.total < b.xferBest {
				b.xferBest = t.total
			}
		}
	}
	res.RawTCPGbps = gbps(res.StateBytes, rawBest)
	res.TransferGbps = gbps(res.WireBytes, b.xferBest)
	res.TransferRatio = res.TransferGbps / res.RawTCPGbps
	res.ThroughputOK = res.TransferRatio >= res.TargetRatio
	say("raw TCP %.2f Gbit/s, transfer %.2f Gbit/s with CRC-32C: %.2f x raw (target >= %.1f)",
		res.RawTCPGbps, res.TransferGbps, res.TransferRatio, res.TargetRatio)
	return nil
}

// lastLayer times the last layer alone on an idle, connected link: the
// bound on the exposed tail.
func (b *tcpBench) lastLayer(ctx context.Context) error {
	var lastBest time.Duration
	for rep := 0; rep < b.f.reps; rep++ {
		t, err := b.g.run(ctx, b.src, []int{b.cfg.NumLayers - 1}, b.f.conns, nil, nil)
		if err != nil {
			return fmt.Errorf("last layer alone: %w", err)
		}
		b.tally(t)
		if lastBest == 0 || t.total < lastBest {
			lastBest = t.total
		}
	}
	b.res.LastLayerSendMS = ms(lastBest)
	b.res.TailLimitMS = b.res.LastLayerSendMS + 10
	return nil
}

// pacedTail measures the exposed tail of a paced prefill: each layer
// handed over after its simulated compute (--prefill-ms, or twice its
// measured send time).
func (b *tcpBench) pacedTail(ctx context.Context) error {
	f, res := b.f, &b.res
	perByte := float64(b.xferBest) / float64(res.WireBytes)
	pace := func(L int) time.Duration {
		if f.prefillMS > 0 {
			return time.Duration(f.prefillMS * float64(time.Millisecond))
		}
		return time.Duration(2 * perByte * float64(b.src.Layers[L].Bytes()))
	}
	res.PrefillMSPerLayer = ms(time.Duration(float64(b.xferBest)*2) / time.Duration(b.cfg.NumLayers))
	if f.prefillMS > 0 {
		res.PrefillMSPerLayer = f.prefillMS
	}
	var tailBest time.Duration
	for rep := 0; rep < f.reps; rep++ {
		t, err := b.g.run(ctx, b.src, b.all, f.conns, pace, nil)
		if err != nil {
			return fmt.Errorf("streaming: %w", err)
		}
		b.tally(t)
		if tailBest == 0 || t.tail < tailBest {
			tailBest = t.tail
		}
	}
	res.ExposedTailMS = ms(tailBest)
	res.TailOK = res.ExposedTailMS <= res.TailLimitMS
	say("streaming with prefill paced at ~%.1f ms/layer: exposed tail %.1f ms; the last layer alone takes %.1f ms (limit %.1f ms)",
		res.PrefillMSPerLayer, res.ExposedTailMS, res.LastLayerSendMS, res.TailLimitMS)
	return nil
}

// faultyProxy streams the state through proxies that flip about 40 bits
// and cut 8 connections over the state, whatever its size. A failed
// transfer is reported, not returned.
func (b *tcpBench) faultyProxy(ctx context.Context) error {
	res := &b.res
	ps, via, err := b.g.proxies(faultproxy.Faults{FlipEvery: max(res.StateBytes/40, 1), CutEvery: max(res.StateBytes/8, 1),
		MaxFaults: 60}, b.f.seed)
	if err != nil {
		return err
	}
	t, err := b.g.run(ctx, b.src, b.all, b.f.conns, nil, via)
	for _, p := range ps {
		st := p.Stats()
		res.FaultFlips += st.Flips
		res.FaultCuts += st.Cuts
		p.Close()
	}
	res.FaultCRCFailures = b.g.checksumFailures()
	res.FaultTransferOK = err == nil
	if err == nil {
		b.tally(t)
	}
	say("through a faulty proxy: %d bits flipped, %d connections cut, %d chunks failed their CRC and were resent; transfer ok: %v (%v)",
		res.FaultFlips, res.FaultCuts, res.FaultCRCFailures, res.FaultTransferOK, err)
	return nil
}

// loadTransferModel loads the state shapes of --model.
func loadTransferModel(name string) (*model.Config, error) {
	if _, err := os.Stat(name); err == nil {
		return model.LoadConfig(name)
	}
	return kvtest.Config(name)
}

func gbps(n int64, d time.Duration) float64 { return float64(n) * 8 / d.Seconds() / 1e9 }
func ms(d time.Duration) float64            { return float64(d.Microseconds()) / 1000 }

// xferGroup is a decode group on loopback: a server per rank, in stages
// of tensor ranks (one rank per stage until split).
type xferGroup struct {
	cfg     *model.Config
	servers []*kvtransfer.Server
	dests   map[int][]kvtransfer.Dest // layer -> its stage's ranks
	shards  []model.Shard             // by server
	slices  map[int]*model.SeqState   // a tensor rank's slice of sliced
	sliced  *model.SeqState
	n       int
	client  kvtransfer.Transport // the sender's (nil: TCP)
}

// split arranges the servers in stages of tensor ranks, the layers split
// over the stages contiguously.
func (g *xferGroup) split(tensor int) error {
	var firsts []string
	for i := 0; i < len(g.servers); i += tensor {
		firsts = append(firsts, g.servers[i].Addr())
	}
	stages, err := kvtransfer.Contiguous(g.cfg.NumLayers, firsts)
	if err != nil {
		return err
	}
	g.dests, g.shards = map[int][]kvtransfer.Dest{}, make([]model.Shard, len(g.servers))
	for L, first := range stages {
		s := slices.Index(firsts, first)
		for t := range tensor {
			sh := model.Shard{Rank: t, Ranks: tensor}
			if tensor == 1 {
				sh = model.Shard{}
			}
			g.shards[s*tensor+t] = sh
			g.dests[L] = append(g.dests[L], kvtransfer.Dest{Endpoint: g.servers[s*tensor+t].Addr(), Shard: sh})
		}
	}
	return nil
}

// want is what server i commits of src: its tensor rank's slice.
func (g *xferGroup) want(src *model.SeqState, i int) (*model.SeqState, error) {
	s := g.shards[i]
	if !s.Split() {
		return src, nil
	}
	if g.sliced != src {
		g.sliced, g.slices = src, map[int]*model.SeqState{}
	}
	if st := g.slices[s.Rank]; st != nil {
		return st, nil
	}
	st, err := g.cfg.ShardSeqState(src, s)
	g.slices[s.Rank] = st
	return st, err
}

// wireBytes are the bytes of the layers of src the ranks receive.
func (g *xferGroup) wireBytes(src *model.SeqState, layers []int) (int64, error) {
	var n int64
	for i, srv := range g.servers {
		st, err := g.want(src, i)
		if err != nil {
			return 0, err
		}
		for _, L := range layers {
			if slices.ContainsFunc(g.dests[L], func(d kvtransfer.Dest) bool { return d.Endpoint == srv.Addr() }) {
				n += int64(st.Layers[L].Bytes())
			}
		}
	}
	return n, nil
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
	if err := g.split(1); err != nil {
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
	defer freeHeap()
	g.n++
	sid := fmt.Sprintf("bench-%d", g.n)
	secret := []byte("bench-transfer-secret-0123456789")
	deadline := time.Now().Add(5 * time.Minute)
	ranks, place, err := g.expect(sid, secret, src, layers, via, deadline)
	if err != nil {
		return xferTiming{}, err
	}
	defer func() {
		for _, r := range ranks {
			r.in.Cancel()
		}
	}()
	snd, err := kvtransfer.NewSender(kvtransfer.SenderConfig{Session: sid, Secret: secret, Placement: place, Conns: conns, Deadline: deadline,
		Transport: g.client})
	if err != nil {
		return xferTiming{}, err
	}
	// Time the streaming, not the handshakes (the raw TCP baseline does
	// not count its dials either).
	if err := awaitDials(ctx, snd, int64(conns*len(ranks)), deadline); err != nil {
		return xferTiming{}, err
	}
	w := awaitRanks(ctx, ranks)
	start, lm := time.Now(), startLoad()
	lastPut, err := sendLayers(ctx, snd, src, layers, pace)
	w.wg.Wait()
	if err != nil {
		return xferTiming{}, err
	}
	cpu := lm.span()
	if w.err != nil {
		return xferTiming{}, w.err
	}
	// Verify after the clock stopped, so that checking one rank does not
	// slow another still receiving.
	out := xferTiming{total: w.lastEnd.Sub(start), tail: w.lastEnd.Sub(lastPut), cpu: cpu}
	for _, r := range ranks {
		want, err := g.want(src, r.server)
		if err != nil {
			return xferTiming{}, err
		}
		n, bad := compareChunks(want, w.states[r.index], r.layers)
		out.chunks += n
		out.corrupt += bad
	}
	return out, nil
}

// freeHeap collects the heap and returns it to the OS, so that each timed
// run starts from the same heap.
func freeHeap() {
	runtime.GC()
	debug.FreeOSMemory()
}

// xferRank is a rank expecting its share of a run's layers: server
// index server, index-th of the run's ranks.
type xferRank struct {
	in            *kvtransfer.Incoming
	layers        []int
	server, index int
}

// expect has each rank owning some of layers expect them (its slice), and
// returns the ranks and the layers' placement (through via when set). On
// error it cancels what it started.
func (g *xferGroup) expect(sid string, secret []byte, src *model.SeqState, layers []int, via map[string]string, deadline time.Time) ([]xferRank, kvtransfer.Placement, error) {
	dests := map[int][]kvtransfer.Dest{}
	var ranks []xferRank
	cancel := func() {
		for _, r := range ranks {
			r.in.Cancel()
		}
	}
	for i, s := range g.servers {
		var own []int
		for _, L := range layers {
			for _, d := range g.dests[L] {
				if d.Endpoint != s.Addr() {
					continue
				}
				own = append(own, L)
				if via != nil {
					d.Endpoint = via[d.Endpoint]
				}
				dests[L] = append(dests[L], d)
			}
		}
		if len(own) == 0 {
			continue
		}
		in, err := s.Expect(kvtransfer.ExpectSpec{Session: sid, Secret: secret, Model: g.cfg, Layers: own, Tokens: src.Tokens,
			Shard: g.shards[i], Deadline: deadline})
		if err != nil {
			cancel()
			return nil, nil, err
		}
		ranks = append(ranks, xferRank{in: in, layers: own, server: i, index: len(ranks)})
	}
	place, err := kvtransfer.NewSharded(g.cfg, dests)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return ranks, place, nil
}

// awaitDials waits until snd has dialed n connections; it aborts snd if
// they are not up by deadline or ctx ends.
func awaitDials(ctx context.Context, snd *kvtransfer.Sender, n int64, deadline time.Time) error {
	for snd.Stats().Dials < n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			snd.Abort(errors.New("bench: connections not established"))
			return errors.New("connections not established")
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// rankWaits is the ranks' waits for their states: wg is done when all
// have returned; then states, lastEnd (the last commit) and err are set.
type rankWaits struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	lastEnd time.Time
	err     error
	states  []*model.SeqState
}

// awaitRanks waits for each rank's committed state in the background.
func awaitRanks(ctx context.Context, ranks []xferRank) *rankWaits {
	w := &rankWaits{states: make([]*model.SeqState, len(ranks))}
	for i, r := range ranks {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			st, err := r.in.Wait(ctx)
			now := time.Now()
			w.mu.Lock()
			defer w.mu.Unlock()
			if err != nil {
				w.err = errors.Join(w.err, err)
				return
			}
			if now.After(w.lastEnd) {
				w.lastEnd = now
			}
			w.states[i] = st
		}()
	}
	return w
}

// sendLayers hands the layers to snd, each after pace(L) when pace is set,
// and closes it; it returns when the last layer was handed over. On a
// failed hand-over it aborts snd.
func sendLayers(ctx context.Context, snd *kvtransfer.Sender, src *model.SeqState, layers []int, pace func(int) time.Duration) (time.Time, error) {
	var lastPut time.Time
	for _, L := range layers {
		if pace != nil {
			time.Sleep(pace(L))
		}
		lastPut = time.Now()
		if err := snd.PutLayer(ctx, src.Layers[L]); err != nil {
			snd.Abort(err)
			return lastPut, err
		}
	}
	return lastPut, snd.Close(ctx, src.Tokens)
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
	defer freeHeap()
	var parts [][]byte
	for _, L := range layers {
		for _, p := range src.Layers[L].Parts {
			parts = append(parts, p.Data)
		}
	}
	mine := func(i int) [][]byte { // connection i's parts
		var out [][]byte
		for j := i; j < len(parts); j += conns {
			out = append(out, parts[j])
		}
		return out
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	done := make(chan rawRecv, conns)
	var readers sync.WaitGroup
	clients := make([]net.Conn, conns)
	for i := 0; i < conns; i++ {
		c, s, id, err := rawPair(ctx, ln, i)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		defer s.Close()
		clients[i] = c
		readers.Add(1)
		go func(dsts [][]byte) {
			defer readers.Done()
			done <- rawRead(s, dsts)
		}(faultedIn(mine(id)))
	}
	start := time.Now()
	werr := rawWrite(clients, mine)
	readers.Wait()
	close(done)
	if werr != nil {
		return 0, werr
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

// rawRecv is a raw TCP reader's outcome: when it read its last byte.
type rawRecv struct {
	end time.Time
	err error
}

// rawPair dials ln as connection i and accepts it; the accepted end reads
// the connection's id.
func rawPair(ctx context.Context, ln net.Listener, i int) (c, s net.Conn, id int, err error) {
	c, err = (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return nil, nil, 0, err
	}
	s, err = ln.Accept()
	if err != nil {
		c.Close()
		return nil, nil, 0, err
	}
	c.Write([]byte{byte(i)})
	var b [1]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		c.Close()
		s.Close()
		return nil, nil, 0, err
	}
	return c, s, int(b[0]), nil
}

// faultedIn returns buffers of the sizes of parts with their pages faulted
// in, as the kvtransfer receiver does before the clock starts.
func faultedIn(parts [][]byte) [][]byte {
	var dsts [][]byte
	for _, p := range parts {
		dst := make([]byte, len(p))
		for i := 0; i < len(dst); i += os.Getpagesize() {
			dst[i] = 0
		}
		dsts = append(dsts, dst)
	}
	return dsts
}

// rawRead fills dsts from s in order.
func rawRead(s net.Conn, dsts [][]byte) rawRecv {
	for _, dst := range dsts {
		if _, err := io.ReadFull(s, dst); err != nil {
			return rawRecv{err: err}
		}
	}
	return rawRecv{end: time.Now()}
}

// rawWrite writes each connection's parts, mine(i), concurrently and
// returns the first error.
func rawWrite(clients []net.Conn, mine func(int) [][]byte) error {
	var writers sync.WaitGroup
	werrs := make(chan error, len(clients))
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
	close(werrs)
	return <-werrs
}

// limitedRun shows the overlap on a rate-limited link: one rank behind a
// proxy at the given rate, a prefill whose per-layer compute takes as long as
// that layer's transfer (the case where overlap matters most).
func limitedRun(ctx context.Context, cfg *model.Config, src *model.SeqState, f transferConfig, res *transferResult) error {
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
