package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"
	"unsafe"

	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
	"github.com/tandem-inference/tandem/model"
)

// rdmaResult is the JSON line of bench transfer --transport rdma-fake.
// Throughputs are in Gbit/s.
type rdmaResult struct {
	Transport    string  `json:"transport"`
	Loss         float64 `json:"loss"`
	Model        string  `json:"model"`
	Tokens       int     `json:"tokens"`
	StateBytes   int64   `json:"state_bytes"`
	Ranks        int     `json:"ranks"`
	ConnsPerRank int     `json:"conns_per_rank"`
	SlotBytes    int     `json:"slot_bytes"`
	Slots        int     `json:"slots"`
	Reps         int     `json:"reps"`
	CPUs         int     `json:"cpus"`

	RawGbps       float64 `json:"raw_gbps"`      // best raw rep
	TransferGbps  float64 `json:"transfer_gbps"` // best transfer rep
	TransferRatio float64 `json:"transfer_vs_raw"`
	// PairRatios are, rep by rep, the raw run's time over the time of
	// the transfer run right after it (both on buffers faulted in before
	// their clocks): the two saw the same machine load. MedianPairRatio
	// is their median, the ratio the target applies to (RatioMethod
	// says so in the JSON).
	PairRatios      []float64 `json:"pair_ratios"`
	MedianPairRatio float64   `json:"median_pair_ratio"`
	RatioMethod     string    `json:"ratio_method"`
	TargetRatio     float64   `json:"target_ratio"`
	ThroughputOK    bool      `json:"throughput_ok"`
	// The CPU time this process spent (user and system, every thread,
	// both ends) per GB moved, median over reps, by the raw wire and by
	// the transfer, and the median over pairs of transfer over raw. Where
	// other work takes the cores, a pair's ratio tends toward raw CPU
	// over transfer CPU: the run that needs more core time waits longer
	// for it. Absent where the process's CPU time is not known.
	RawCPUPerGB      float64 `json:"raw_cpu_s_per_gb,omitempty"`
	TransferCPUPerGB float64 `json:"transfer_cpu_s_per_gb,omitempty"`
	CPURatio         float64 `json:"cpu_ratio,omitempty"`
	// PairOthers is, pair by pair, the share of the machine's cores (0..1)
	// that other processes used while the pair ran: 0 on a quiet machine.
	PairOthers []float64 `json:"pair_others_share,omitempty"`

	Retransmits            int64 `json:"retransmits"`
	Timeouts               int64 `json:"timeouts"`
	FastRetransmits        int64 `json:"fast_retransmits"`
	SlotsSent              int64 `json:"slots_sent"`
	AckSlots               int64 `json:"ack_slots"`
	DirectSlots            int64 `json:"direct_slots"` // of slots_received: copied by the poller straight into a waiting reader's destination
	SlotsReceived          int64 `json:"slots_received"`
	WireLost               int64 `json:"wire_lost"`
	WireNoRecvDrops        int64 `json:"wire_no_recv_drops"`
	ChunksVerified         int64 `json:"chunks_verified"`
	CorruptChunksCommitted int64 `json:"corrupt_chunks_committed"`
	CorruptCheckPassed     bool  `json:"corrupt_check_ok"`
}

var benchGID = verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))

// ratioMethod says in the JSON how throughput_ok is decided.
const ratioMethod = "median over reps of raw_time/transfer_time, each transfer timed right after its raw run, " +
	"buffers of both faulted in before their clocks; transfer_vs_raw is best transfer over best raw"

// pairRatios returns, for each rep i, raw[i]/xfer[i] (the transfer's
// throughput as a fraction of the raw wire's in the same stretch of
// machine load), and their median. Reps missing either time are skipped.
func pairRatios(raw, xfer []time.Duration) ([]float64, float64) {
	var rs []float64
	for i := range min(len(raw), len(xfer)) {
		if raw[i] > 0 && xfer[i] > 0 {
			rs = append(rs, float64(raw[i])/float64(xfer[i]))
		}
	}
	return rs, median(rs)
}

// transferRDMAFake streams the state through kvtransfer over the RDMA link
// on the fake wire losing a fraction f.loss of its messages, and moves the
// same bytes over the bare fake wire in the same run: raw, transfer, raw,
// transfer, ... (f.reps pairs), so that each pair sees the same load.
func transferRDMAFake(ctx context.Context, f transferConfig, cfg *model.Config, src *model.SeqState) error {
	res := rdmaResult{Transport: "rdma-fake", Loss: f.loss, Model: f.model, Tokens: f.tokens, StateBytes: int64(src.Bytes()),
		Ranks: f.ranks, ConnsPerRank: f.conns, SlotBytes: f.slotSize, Slots: f.slots, Reps: f.reps,
		CPUs: runtime.NumCPU(), TargetRatio: 0.9}
	if f.loss > 0 {
		res.TargetRatio = 0.5
	}
	rig, err := startRDMARig(f, cfg)
	defer rig.close()
	if err != nil {
		return err
	}
	say("state: %s, T=%d, %.1f MB; %d ranks x %d connections over RDMA links on the fake wire (%d slots of %d KiB), loss %.2f%%",
		f.model, f.tokens, float64(res.StateBytes)/1e6, f.ranks, f.conns, res.Slots, res.SlotBytes>>10, 100*f.loss)
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if err := rig.pairs(ctx, f, src, &res); err != nil {
		return err
	}
	rig.stats(&res)
	res.CorruptCheckPassed = res.CorruptChunksCommitted == 0
	say("raw fake wire %.2f Gbit/s, transfer %.2f Gbit/s (best of each: %.2f x); median of the pairs' ratios %.2f x raw (target >= %.1f); %d of %d slots resent (%d timer expiries), %d ack-only slots, %d of %d slots received placed by the poller, %d lost on the wire, %d dropped for want of a posted receive; %d chunks committed, %d corrupt",
		res.RawGbps, res.TransferGbps, res.TransferRatio, res.MedianPairRatio, res.TargetRatio, res.Retransmits, res.SlotsSent, res.Timeouts, res.AckSlots, res.DirectSlots, res.SlotsReceived, res.WireLost, res.WireNoRecvDrops,
		res.ChunksVerified, res.CorruptChunksCommitted)
	if f.asJSON {
		return printJSON(res)
	}
	return nil
}

// rdmaRig is a decode group on loopback whose ranks and sender use RDMA
// links on one fake wire.
type rdmaRig struct {
	fab *fakeverbs.Fabric
	trs []*rdma.Transport
	g   *xferGroup
}

// startRDMARig starts the group of f on a fake wire losing f.loss of its
// messages. The rig must be closed, even on error.
func startRDMARig(f transferConfig, cfg *model.Config) (*rdmaRig, error) {
	r := &rdmaRig{fab: fakeverbs.NewFabric(fakeverbs.Faults{Loss: f.loss}, f.seed)}
	rc := rdma.Config{SlotSize: f.slotSize, Slots: f.slots}
	newTr := func(host string) (kvtransfer.Transport, error) {
		c := rc
		c.Provider = r.fab.Host(host, benchGID)
		t, err := rdma.New(c)
		if err != nil {
			return nil, err
		}
		r.trs = append(r.trs, t)
		return kvtransfer.RDMA{T: t}, nil
	}
	client, err := newTr("prefill")
	if err != nil {
		return r, err
	}
	var serr error
	g, err := startGroupOn(cfg, f.ranks, f.chunk, f.window, func(i int) kvtransfer.Transport {
		t, err := newTr(fmt.Sprintf("rank%d", i))
		serr = errors.Join(serr, err)
		return t
	}, client)
	if err != nil || serr != nil {
		return r, errors.Join(err, serr)
	}
	r.g = g
	return r, nil
}

// close stops the group, then the links.
func (r *rdmaRig) close() {
	if r.g != nil {
		r.g.close()
	}
	for _, t := range r.trs {
		t.Close()
	}
}

// startCPUProfile profiles the CPU into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		pf.Close()
	}, nil
}

// pairs times f.reps pairs of a raw fake-wire run and a transfer, and
// fills in res's throughputs, ratios, CPU and chunk counts.
func (r *rdmaRig) pairs(ctx context.Context, f transferConfig, src *model.SeqState, res *rdmaResult) error {
	all := kvtest.AllLayers(r.g.cfg.NumLayers)
	var rawBest, xferBest time.Duration
	var raws, xfers []time.Duration
	var rawCPU, xferCPU, cpuRatios []float64
	for rep := 0; rep < f.reps; rep++ {
		d, dcpu, err := rawFakeWire(src, all, res.SlotBytes, res.Slots)
		if err != nil {
			return fmt.Errorf("raw fake wire: %w", err)
		}
		raws = append(raws, d)
		if rawBest == 0 || d < rawBest {
			rawBest = d
		}
		t, err := r.g.run(ctx, src, all, f.conns, nil, nil)
		if err != nil {
			return fmt.Errorf("transfer: %w", err)
		}
		res.ChunksVerified += t.chunks
		res.CorruptChunksCommitted += t.corrupt
		xfers = append(xfers, t.total)
		if dcpu.ok && t.cpu.ok && dcpu.self > 0 {
			gb := float64(res.StateBytes) / 1e9
			rawCPU = append(rawCPU, dcpu.self.Seconds()/gb)
			xferCPU = append(xferCPU, t.cpu.self.Seconds()/gb)
			cpuRatios = append(cpuRatios, t.cpu.self.Seconds()/dcpu.self.Seconds())
			res.PairOthers = append(res.PairOthers,
				(dcpu.others*d.Seconds()+t.cpu.others*t.total.Seconds())/(d+t.total).Seconds())
		}
		if xferBest == 0 || t.total < xferBest {
			xferBest = t.total
		}
		say("rep %d: raw %.2f Gbit/s, transfer %.2f Gbit/s: %.2f x", rep+1, gbps(res.StateBytes, d), gbps(res.StateBytes, t.total),
			float64(d)/float64(t.total))
	}
	res.RawGbps = gbps(res.StateBytes, rawBest)
	res.TransferGbps = gbps(res.StateBytes, xferBest)
	res.TransferRatio = res.TransferGbps / res.RawGbps
	res.PairRatios, res.MedianPairRatio = pairRatios(raws, xfers)
	res.RatioMethod = ratioMethod
	res.ThroughputOK = res.MedianPairRatio >= res.TargetRatio
	if len(cpuRatios) > 0 {
		res.RawCPUPerGB, res.TransferCPUPerGB, res.CPURatio = median(rawCPU), median(xferCPU), median(cpuRatios)
		say("CPU per GB moved: raw wire %.3f s, transfer %.3f s (%.2f x); other processes used %s of the cores during the pairs",
			res.RawCPUPerGB, res.TransferCPUPerGB, res.CPURatio, shares(res.PairOthers))
	}
	return nil
}

// stats adds the links' and the wire's counters to res.
func (r *rdmaRig) stats(res *rdmaResult) {
	for _, t := range r.trs {
		st := t.Stats()
		res.Retransmits += st.Retransmits
		res.Timeouts += st.Timeouts
		res.FastRetransmits += st.FastRetransmits
		res.SlotsSent += st.SlotsSent
		res.AckSlots += st.AcksSent
		res.DirectSlots += st.Direct
		res.SlotsReceived += st.SlotsReceived
	}
	res.WireLost = r.fab.Stats().Lost
	res.WireNoRecvDrops = r.fab.Stats().NoRecvDrops
}

// pageAligned returns n bytes starting on a page boundary (the fake wire,
// like Apple's, registers only page-aligned memory).
func pageAligned(n int) []byte {
	const page = 16 << 10 // a multiple of every page size in use
	b := make([]byte, n+page)
	off := int(uintptr(page) - uintptr(unsafe.Pointer(&b[0]))%page)
	return b[off%page : off%page+n]
}

// rawFakeWire moves the parts of layers of src over one fake-wire queue
// pair without the link: full-slot SENDs copied from the parts, RECVs
// copied out into destination buffers and reposted, a slot handed back to
// the sender after its repost (in-process, not over the wire), no
// headers, acknowledgements or retransmission, and no loss. It returns the
// time from the first copy to the last byte placed. Like the transfer
// (xferGroup.run) it faults its buffers in before the clock and leaves
// the heap collected, so that each timed run starts from the same heap.
func rawFakeWire(src *model.SeqState, layers []int, slot, slots int) (time.Duration, cpuSpan, error) {
	defer freeHeap()
	ends, closeEnds, err := openRawEnds(slot, slots)
	defer closeEnds()
	if err != nil {
		return 0, cpuSpan{}, err
	}
	w := rawWire{tx: ends[0], rx: ends[1], slot: slot, slots: slots}
	var total int
	var dsts [][]byte
	for _, L := range layers {
		for _, p := range src.Layers[L].Parts {
			total += len(p.Data)
			dsts = append(dsts, make([]byte, len(p.Data)))
		}
	}
	// Fault every page in before the clock, as kvtransfer's receiver does
	// with its buffers (when the sender authenticates, before the
	// transfer's clock) and the link with its arena (when it is mapped).
	for _, b := range append(dsts, w.tx.buf, w.rx.buf) {
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
	}
	for i := 0; i < slots; i++ {
		if err := w.rx.qp.PostRecv(uint64(i), w.rx.mr, w.at(w.rx.buf, i)); err != nil {
			return 0, cpuSpan{}, err
		}
	}
	w.credits = make(chan int, slots) // send slots whose message was consumed
	for i := 0; i < slots; i++ {
		w.credits <- i
	}
	done := make(chan error, 1)
	start, lm := time.Now(), startLoad()
	go func() { done <- w.receive(dsts, total) }()
	if err := w.send(src, layers); err != nil {
		return 0, cpuSpan{}, err
	}
	if err := <-done; err != nil {
		return 0, cpuSpan{}, err
	}
	d := time.Since(start)
	return d, lm.span(), nil
}

// rawEnd is one end of a bare fake-wire queue pair, with its slots' buffer.
type rawEnd struct {
	ctx verbs.Context
	pd  verbs.PD
	cq  verbs.CQ
	qp  verbs.QP
	mr  verbs.MR
	buf []byte
}

// openRawEnds opens two ends of slots slots of slot bytes on a lossless
// fake wire and connects them. closeEnds closes the ends set up, even on
// error.
func openRawEnds(slot, slots int) (ends [2]rawEnd, closeEnds func(), err error) {
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	var opened []*rawEnd
	closeEnds = func() {
		for _, e := range opened {
			e.qp.Close()
			e.mr.Close()
			e.cq.Close()
		}
	}
	for i := range ends {
		e := &ends[i]
		if e.ctx, err = fab.Host(fmt.Sprint("raw", i), benchGID).Open(fakeverbs.DeviceName); err != nil {
			return ends, closeEnds, err
		}
		if e.pd, err = e.ctx.AllocPD(); err != nil {
			return ends, closeEnds, err
		}
		if e.cq, err = e.ctx.CreateCQ(4 * slots); err != nil {
			return ends, closeEnds, err
		}
		frames := slots * verbs.Frames(slot)
		if e.qp, err = e.pd.CreateQP(verbs.QPInit{SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: frames, MaxRecvWR: frames}); err != nil {
			return ends, closeEnds, err
		}
		e.buf = pageAligned(slots * slot)
		if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessDefault); err != nil {
			return ends, closeEnds, err
		}
		opened = append(opened, e)
	}
	for i := range ends {
		e, p := ends[i], ends[1-i]
		if err := errors.Join(e.qp.Init(1), e.qp.ReadyToReceive(verbs.RTR{Port: 1, MTU: 5, DestQPN: p.qp.Num(), DGID: benchGID, SGIDIndex: 1})); err != nil {
			return ends, closeEnds, err
		}
		if err := e.qp.ReadyToSend(0); err != nil {
			return ends, closeEnds, err
		}
	}
	return ends, closeEnds, nil
}

// rawWire moves bytes from tx to rx in full slots; credits holds the send
// slots whose message rx has consumed.
type rawWire struct {
	tx, rx      rawEnd
	slot, slots int
	credits     chan int
}

// at is slot i of b.
func (w *rawWire) at(b []byte, i int) []byte { return b[i*w.slot : (i+1)*w.slot] }

// receive copies each received slot out in order into dsts until total
// bytes came, reposting the slot and handing a credit back.
func (w *rawWire) receive(dsts [][]byte, total int) error {
	wcs := make([]verbs.WC, 64)
	got, di, doff := 0, 0, 0
	for got < total {
		n, err := w.rx.cq.Poll(wcs)
		if err != nil {
			return err
		}
		if n == 0 {
			<-w.rx.cq.(verbs.Notifier).Notify()
			continue
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.StatusSuccess {
				return fmt.Errorf("receive completion: %s", wc.Status)
			}
			b := w.at(w.rx.buf, int(wc.ID))
			for len(b) > 0 && got < total {
				c := copy(dsts[di][doff:], b)
				b, doff, got = b[c:], doff+c, got+c
				if doff == len(dsts[di]) {
					di, doff = di+1, 0
				}
			}
			if err := w.rx.qp.PostRecv(wc.ID, w.rx.mr, w.at(w.rx.buf, int(wc.ID))); err != nil {
				return err
			}
			w.credits <- 0
		}
	}
	return nil
}

// send fills full slots from the parts of layers, in order, and sends
// each (the last one whole too) when it has a credit.
func (w *rawWire) send(src *model.SeqState, layers []int) error {
	wcs := make([]verbs.WC, 64)
	next, fill := 0, 0
	flush := func() error {
		<-w.credits
		b := w.at(w.tx.buf, next)
		clear(b[fill:]) // the last slot is sent whole too
		if err := w.tx.qp.PostSend(uint64(next), w.tx.mr, b); err != nil {
			return err
		}
		if _, err := w.tx.cq.Poll(wcs); err != nil { // reap send completions
			return err
		}
		next, fill = (next+1)%w.slots, 0
		return nil
	}
	for _, L := range layers {
		for _, p := range src.Layers[L].Parts {
			d := p.Data
			for len(d) > 0 {
				c := copy(w.at(w.tx.buf, next)[fill:], d)
				d, fill = d[c:], fill+c
				if fill == w.slot {
					if err := flush(); err != nil {
						return err
					}
				}
			}
		}
	}
	if fill > 0 {
		return flush()
	}
	return nil
}

// shares formats shares of the cores as percentages, "0% 12% 3%".
func shares(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.0f%%", 100*x)
	}
	return b.String()
}
