package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
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
func transferRDMAFake(ctx context.Context, f transferFlags, cfg *model.Config, src *model.SeqState) error {
	if f.loss < 0 || f.loss >= 1 {
		return fmt.Errorf("--loss %v: want a probability in [0, 1)", f.loss)
	}
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	rc := rdma.Config{SlotSize: f.slotSize, Slots: f.slots}
	res := rdmaResult{Transport: "rdma-fake", Loss: f.loss, Model: f.model, Tokens: f.tokens, StateBytes: int64(src.Bytes()),
		Ranks: f.ranks, ConnsPerRank: f.conns, SlotBytes: f.slotSize, Slots: f.slots, Reps: f.reps,
		CPUs: runtime.NumCPU(), TargetRatio: 0.9}
	if f.loss > 0 {
		res.TargetRatio = 0.5
	}
	fab := fakeverbs.NewFabric(fakeverbs.Faults{Loss: f.loss}, f.seed)
	var trs []*rdma.Transport
	newTr := func(host string) (kvtransfer.Transport, error) {
		c := rc
		c.Provider = fab.Host(host, benchGID)
		t, err := rdma.New(c)
		if err != nil {
			return nil, err
		}
		trs = append(trs, t)
		return kvtransfer.RDMA{T: t}, nil
	}
	defer func() {
		for _, t := range trs {
			t.Close()
		}
	}()
	client, err := newTr("prefill")
	if err != nil {
		return err
	}
	var serr error
	g, err := startGroupOn(cfg, f.ranks, f.chunk, f.window, func(i int) kvtransfer.Transport {
		t, err := newTr(fmt.Sprintf("rank%d", i))
		serr = errors.Join(serr, err)
		return t
	}, client)
	if err != nil || serr != nil {
		return errors.Join(err, serr)
	}
	defer g.close()
	say("state: %s, T=%d, %.1f MB; %d ranks x %d connections over RDMA links on the fake wire (%d slots of %d KiB), loss %.2f%%",
		f.model, f.tokens, float64(res.StateBytes)/1e6, f.ranks, f.conns, res.Slots, res.SlotBytes>>10, 100*f.loss)
	all := kvtest.AllLayers(cfg.NumLayers)
	var rawBest, xferBest time.Duration
	var raws, xfers []time.Duration
	var rawCPU, xferCPU, cpuRatios []float64
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	for rep := 0; rep < f.reps; rep++ {
		d, dcpu, err := rawFakeWire(src, all, res.SlotBytes, res.Slots)
		if err != nil {
			return fmt.Errorf("raw fake wire: %w", err)
		}
		raws = append(raws, d)
		if rawBest == 0 || d < rawBest {
			rawBest = d
		}
		t, err := g.run(ctx, src, all, f.conns, nil, nil)
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
	for _, t := range trs {
		st := t.Stats()
		res.Retransmits += st.Retransmits
		res.Timeouts += st.Timeouts
		res.FastRetransmits += st.FastRetransmits
		res.SlotsSent += st.SlotsSent
		res.AckSlots += st.AcksSent
		res.DirectSlots += st.Direct
		res.SlotsReceived += st.SlotsReceived
	}
	res.WireLost = fab.Stats().Lost
	res.WireNoRecvDrops = fab.Stats().NoRecvDrops
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
	res.CorruptCheckPassed = res.CorruptChunksCommitted == 0
	say("raw fake wire %.2f Gbit/s, transfer %.2f Gbit/s (best of each: %.2f x); median of the pairs' ratios %.2f x raw (target >= %.1f); %d of %d slots resent (%d timer expiries), %d ack-only slots, %d of %d slots received placed by the poller, %d lost on the wire, %d dropped for want of a posted receive; %d chunks committed, %d corrupt",
		res.RawGbps, res.TransferGbps, res.TransferRatio, res.MedianPairRatio, res.TargetRatio, res.Retransmits, res.SlotsSent, res.Timeouts, res.AckSlots, res.DirectSlots, res.SlotsReceived, res.WireLost, res.WireNoRecvDrops,
		res.ChunksVerified, res.CorruptChunksCommitted)
	if f.asJSON {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Println(string(b))
	}
	return nil
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
	defer func() {
		runtime.GC()
		debug.FreeOSMemory()
	}()
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	type end struct {
		ctx verbs.Context
		pd  verbs.PD
		cq  verbs.CQ
		qp  verbs.QP
		mr  verbs.MR
		buf []byte
	}
	var ends [2]end
	for i := range ends {
		e := &ends[i]
		var err error
		if e.ctx, err = fab.Host(fmt.Sprint("raw", i), benchGID).Open(fakeverbs.DeviceName); err != nil {
			return 0, cpuSpan{}, err
		}
		if e.pd, err = e.ctx.AllocPD(); err != nil {
			return 0, cpuSpan{}, err
		}
		if e.cq, err = e.ctx.CreateCQ(4 * slots); err != nil {
			return 0, cpuSpan{}, err
		}
		frames := slots * verbs.Frames(slot)
		if e.qp, err = e.pd.CreateQP(verbs.QPInit{SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: frames, MaxRecvWR: frames}); err != nil {
			return 0, cpuSpan{}, err
		}
		e.buf = pageAligned(slots * slot)
		if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessDefault); err != nil {
			return 0, cpuSpan{}, err
		}
		defer func() { e.qp.Close(); e.mr.Close(); e.cq.Close() }()
	}
	for i := range ends {
		e, p := ends[i], ends[1-i]
		if err := errors.Join(e.qp.Init(1), e.qp.ReadyToReceive(verbs.RTR{Port: 1, MTU: 5, DestQPN: p.qp.Num(), DGID: benchGID, SGIDIndex: 1})); err != nil {
			return 0, cpuSpan{}, err
		}
		if err := e.qp.ReadyToSend(0); err != nil {
			return 0, cpuSpan{}, err
		}
	}
	tx, rx := ends[0], ends[1]
	at := func(b []byte, i int) []byte { return b[i*slot : (i+1)*slot] }
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
	for _, b := range append(dsts, tx.buf, rx.buf) {
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
	}
	for i := 0; i < slots; i++ {
		if err := rx.qp.PostRecv(uint64(i), rx.mr, at(rx.buf, i)); err != nil {
			return 0, cpuSpan{}, err
		}
	}
	credits := make(chan int, slots) // send slots whose message was consumed
	for i := 0; i < slots; i++ {
		credits <- i
	}
	done := make(chan error, 1)
	start, lm := time.Now(), startLoad()
	go func() {
		// The receiver: copy each slot out in order and repost it.
		wcs := make([]verbs.WC, 64)
		got, di, doff := 0, 0, 0
		for got < total {
			n, err := rx.cq.Poll(wcs)
			if err != nil {
				done <- err
				return
			}
			if n == 0 {
				<-rx.cq.(verbs.Notifier).Notify()
				continue
			}
			for _, wc := range wcs[:n] {
				if wc.Status != verbs.StatusSuccess {
					done <- fmt.Errorf("receive completion: %s", wc.Status)
					return
				}
				b := at(rx.buf, int(wc.ID))
				for len(b) > 0 && got < total {
					c := copy(dsts[di][doff:], b)
					b, doff, got = b[c:], doff+c, got+c
					if doff == len(dsts[di]) {
						di, doff = di+1, 0
					}
				}
				if err := rx.qp.PostRecv(wc.ID, rx.mr, at(rx.buf, int(wc.ID))); err != nil {
					done <- err
					return
				}
				credits <- 0
			}
		}
		done <- nil
	}()
	// The sender: fill full slots from the parts, in order.
	wcs := make([]verbs.WC, 64)
	next := 0
	var cur []byte
	fill := 0
	send := func() error {
		<-credits
		b := at(tx.buf, next)
		clear(b[fill:]) // the last slot is sent whole too
		if err := tx.qp.PostSend(uint64(next), tx.mr, b); err != nil {
			return err
		}
		if _, err := tx.cq.Poll(wcs); err != nil { // reap send completions
			return err
		}
		next, fill = (next+1)%slots, 0
		return nil
	}
	for _, L := range layers {
		for _, p := range src.Layers[L].Parts {
			d := p.Data
			for len(d) > 0 {
				cur = at(tx.buf, next)
				c := copy(cur[fill:], d)
				d, fill = d[c:], fill+c
				if fill == slot {
					if err := send(); err != nil {
						return 0, cpuSpan{}, err
					}
				}
			}
		}
	}
	if fill > 0 {
		if err := send(); err != nil {
			return 0, cpuSpan{}, err
		}
	}
	if err := <-done; err != nil {
		return 0, cpuSpan{}, err
	}
	d := time.Since(start)
	return d, lm.span(), nil
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
