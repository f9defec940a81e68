package service

import (
	"strings"
	"sync"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/modelconfig"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/media"
)

// loadTracker is what the coordinator knows of the work it has handed out:
// the prompts each prefill worker holds (and how far its pass is) and the
// prompts each decode group prefills itself. The router prices the queues
// from it.
type loadTracker struct {
	mu      sync.Mutex
	prefill map[string]map[string]*prefillLoad // worker -> job -> load
	local   map[string]map[string]int          // group -> job -> prompt tokens not yet prefilled
}

type prefillLoad struct {
	tokens      int
	done, total int // layers of the current pass
}

func newLoadTracker() *loadTracker {
	return &loadTracker{prefill: map[string]map[string]*prefillLoad{}, local: map[string]map[string]int{}}
}

func (t *loadTracker) addPrefill(worker, job string, tokens int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.prefill[worker] == nil {
		t.prefill[worker] = map[string]*prefillLoad{}
	}
	t.prefill[worker][job] = &prefillLoad{tokens: tokens}
}

func (t *loadTracker) prefillProgress(worker, job string, done, total int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.prefill[worker][job]; l != nil {
		l.done, l.total = done, total
	}
}

func (t *loadTracker) addLocal(group, job string, tokens int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.local[group] == nil {
		t.local[group] = map[string]int{}
	}
	t.local[group][job] = tokens
}

// forget drops a job's load (its prefill is over, or the job is).
func (t *loadTracker) forget(job string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.prefill {
		delete(m, job)
	}
	for _, m := range t.local {
		delete(m, job)
	}
}

// routerLoad prices the queues in front of a new job on prefill worker pf
// (empty: none up) and decode group g, which prefills chunk rows per step,
// at rates r for model m.
func (t *loadTracker) routerLoad(m *costmodel.Model, pf, g string, chunk int, r router.Rates) router.Load {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := router.Load{PrefillUp: pf != ""}
	if pf != "" {
		var running costmodel.FLOPs
		frac := 1.0
		for _, pl := range t.prefill[pf] {
			if pl.total > 0 && pl.done > 0 {
				running = running.Add(m.Work(0, pl.tokens))
				frac = min(frac, float64(pl.done)/float64(pl.total))
			} else {
				l.NextPass = append(l.NextPass, pl.tokens)
			}
		}
		if running.Total() > 0 {
			pass := max(r.PassFloor, r.Prefill.Time(running, m.Layers))
			l.PassRunning = true
			l.PassRemaining = time.Duration(float64(pass) * (1 - frac))
		}
	}
	for _, n := range t.local[g] {
		l.LocalQueue = append(l.LocalQueue, n)
	}
	l.LocalChunk = chunk
	return l
}

// unknown is where a prediction stops meaning anything: the router's
// figure for a rate of zero.
const unknown = 1000 * time.Hour

// rates are the cost model's rates: the workers' own measurements where
// their heartbeats carry them (the compute terms each fitted to its
// finished prefills, the prefill worker's pass floor from its measured
// read rate), the estimator's (seeded from config, moved by finished jobs)
// for the rest.
func (c *Coordinator) rates(pf *cp.WorkerInfo, g *group) router.Rates {
	r := c.est.Rates()
	if pf != nil {
		if t := pf.Rates.Compute; t != nil && t.Samples > 0 {
			r.Prefill = t.Compute()
		}
		if pf.Rates.ReadBytesPerSec > 0 && pf.Rates.PassFloor > 0 {
			r.PassFloor = pf.Rates.PassFloor
		} else if r.PassFloor <= 0 {
			r.PassFloor = pf.Rates.PassFloor
		}
		if r.LinkBytesPerS <= 0 {
			r.LinkBytesPerS = pf.Rates.LinkBytesPerSec
		}
		r.PrefillVision, r.PrefillVisionSerial = pf.Rates.VisionGFLOPS, onDevice(pf.Backend)
	}
	if g != nil {
		h := g.Head()
		if t := h.Rates.Compute; t != nil && t.Samples > 0 {
			r.Local = t.Compute()
		}
		r.LocalVision, r.LocalVisionSerial = h.Rates.VisionGFLOPS, onDevice(h.Backend)
		if r.DecodeStep <= 0 && h.Rates.DecodeTokensPerSec > 0 {
			r.DecodeStep = time.Duration(float64(time.Second) / h.Rates.DecodeTokensPerSec)
		}
	}
	return r
}

// decide routes a prompt of n tokens under policy between prefill worker
// pf (nil: none usable) and group g.
func (c *Coordinator) decide(policy cp.Policy, pf *cp.WorkerInfo, g *group, prompt []int32, images [][]byte) (*cp.RouteDecision, router.Decision) {
	n := len(prompt)
	r := c.rates(pf, g)
	pfID := ""
	if pf != nil && n > 1 {
		// A one-token prompt has nothing to prefill remotely.
		pfID = pf.ID
	}
	pol := router.Policy(policy)
	m := c.cfg.Model.Cost
	load := c.load.routerLoad(m, pfID, g.ID, g.Head().PrefillChunk, r)
	load.LocalStages = g.stages()
	h := g.Head()
	load.LocalCached = cachedPrefix(&h, prompt)
	load.LocalStops = snapshotStops(&h, load.LocalCached, n)
	load.RemoteSplit, load.RemoteCached, load.RemoteAppend = remoteCaches(pf, &h, prompt)
	load.RemoteCopies = h.TensorRanks // a stage's tensor ranks each get the latent rows
	load.Images = pricedImages(prompt, images, int32(c.cfg.Model.VocabSize-256+modelconfig.MediaPadOffset))
	d := router.Route(pol, m, r, load, n)
	if n <= 1 && pf != nil {
		d.Reason = "a one-token prompt has nothing to prefill: " + d.Reason
	}
	rd := &cp.RouteDecision{Policy: policy, Target: cp.Target(d.Target), PredictedLocal: d.Local.Total,
		PredictedRemote: d.Remote.Total, DecodeGroup: g.ID, Reason: d.Reason, CachedTokens: load.LocalCached}
	// A side whose rates are not known yet has no prediction: say so
	// rather than show the router's stand-in for infinity.
	if d.Local.Total >= unknown {
		rd.PredictedLocal, rd.Reason = 0, rd.Reason+" (the decode group's prefill rate is not measured yet)"
	}
	if d.Remote.Total >= unknown {
		rd.PredictedRemote, rd.Reason = 0, rd.Reason+" (the prefill worker's rates are not measured yet)"
	}
	chosen := d.Local
	if d.Target == router.TargetRemote {
		rd.PrefillWorker = pf.ID
		chosen = d.Remote
	}
	if chosen.Total < unknown {
		rd.Parts = &cp.PredictedParts{QueueWait: chosen.QueueWait, Pass: chosen.Pass, Prefill: chosen.Prefill,
			TransferTail: chosen.TransferTail, FirstStep: chosen.FirstStep, Overhead: chosen.Overhead}
	}
	return rd, d
}

// cachedPrefix is how many of prompt's first tokens the decode group whose
// head is h can resume from its prefix cache, by the prefixes its heartbeat
// advertises (0 when it advertises none). The group compares the tokens
// itself: a hash collision here only misprices one job.
func cachedPrefix(h *cp.WorkerInfo, prompt []int32) int {
	// The last prompt token always runs as the first decode step.
	return longestHeld(h.PrefixCache, prompt, len(prompt)-1)
}

// snapshotStops are where the group whose head is h ends a local prompt's
// prefill steps to keep its state (none when its cache is off or paused):
// from the cached prefix it resumes at to the prompt's prefilled end.
func snapshotStops(h *cp.WorkerInfo, cached, prompt int) []int {
	c := h.PrefixCache
	if c == nil || c.Salt == 0 {
		return nil
	}
	return prefixkey.Snapshots(cached, prompt-1, c.Stride)
}

// longestHeld is the longest prefix of prompt, at most limit tokens, among
// those a cache advertises (0 when it advertises none or is nil).
func longestHeld(c *cp.PrefixCacheInfo, prompt []int32, limit int) int {
	if c == nil || len(c.Prefixes) == 0 {
		return 0
	}
	held := make(map[prefixkey.Hash]int, len(c.Prefixes))
	for _, p := range c.Prefixes {
		held[prefixkey.Hash(p.Link)] = p.Tokens
	}
	return prefixkey.Longest(prefixkey.SHA256, prefixkey.Hash(c.Salt), prompt, limit, held)
}

// remoteCaches is how a remote prefill of prompt uses the prefix caches
// when the prefill worker pf has a prefix store and the group whose head
// is h a prefix cache (zeros otherwise): the prefill worker's part ends at
// split, the last multiple of 64 before the prompt's last token, so that
// both sides can keep the state there as an entry (the group prefills the
// few tokens after it itself); the worker resumes from the longest prefix
// of its part that its store advertises (cached); the group appends the
// state to the rows of the longest prefix it advertises (appendTo), at
// most one block short of the split so that the worker has rows to send.
// Both sides compare the tokens themselves: a collision here misprices a
// job, and the group takes a proposed base only if it holds it.
func remoteCaches(pf, h *cp.WorkerInfo, prompt []int32) (split, cached, appendTo int) {
	if pf == nil || pf.PrefixCache == nil || h.PrefixCache == nil {
		return 0, 0, 0
	}
	split = (len(prompt) - 1) / prefixkey.Block * prefixkey.Block
	if split == 0 {
		return 0, 0, 0
	}
	cached = longestHeld(pf.PrefixCache, prompt, split)
	appendTo = min(longestHeld(h.PrefixCache, prompt, split), split-prefixkey.Block)
	return split, cached, appendTo
}

// pricedImages are a job's images as the router prices them: each one's
// patch grid from its header alone (media.Probe and the scale rule), on
// its pad run. An image whose header does not read is not priced (the
// worker that decodes it refuses the job).
func pricedImages(prompt []int32, images [][]byte, pad int32) []costmodel.Image {
	if len(images) == 0 {
		return nil
	}
	patches := make([]int, len(images))
	for i, data := range images {
		info, err := media.Probe(data, media.DefaultLimits())
		if err != nil {
			continue
		}
		if _, _, gw, gh, err := media.Plan(info.Width, info.Height); err == nil {
			patches[i] = gw * gh
		}
	}
	return costmodel.ImagesOf(prompt, pad, patches)
}

// onDevice tells a worker whose backend is a device's (not the CPU): it
// runs the vision tower in its own loop, not beside its queue.
func onDevice(backend string) bool { return backend != "" && !strings.HasPrefix(backend, "cpu") }
