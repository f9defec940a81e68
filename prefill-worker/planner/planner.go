package planner

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
)

// Align is the token granularity of super-chunks and tiles: a prompt is cut
// only at multiples of the KDA chunk from its start.
const Align = model.KDAChunk

// DefaultMaxDepth caps the automatic prefetch depth: two layers in flight
// hide read jitter; more only takes memory from the activations.
const DefaultMaxDepth = 2

// DefaultMaxTile caps the rows of one layer call when the backend states no
// limit: larger tiles gain nothing on the CPU (its GEMM works in 64-row
// blocks) and cost temporaries.
const DefaultMaxTile = 2048

// Job is a queued or running prefill job as the planner sees it.
type Job struct {
	ID string
	// Total is the number of tokens to prefill (the prompt minus its last
	// token); Done how many earlier passes prefilled (a multiple of Align
	// while Done < Total).
	Total, Done int
}

// Input is everything one plan depends on.
type Input struct {
	Costs  Costs
	Budget int64
	// Depth is the prefetch depth (layers read ahead of compute; the ring has
	// Depth+1 slots), or -1 to choose it (up to MaxDepth, default
	// DefaultMaxDepth).
	Depth, MaxDepth int
	// MaxTile is the backend's row limit per layer call (0: DefaultMaxTile).
	MaxTile int
	// Jobs in priority order: jobs already in progress (Done > 0) must come
	// first, then new jobs in arrival order.
	Jobs []Job
	// Draining is memory the pass does not own but must leave alone: layer
	// states of finished jobs still queued towards their sinks.
	Draining int64
}

// Piece is the tokens [Lo, Hi) of one job that a pass prefills. Final says
// the piece ends the job's prompt, so the pass hands the job's state to its
// sink layer by layer.
type Piece struct {
	Job    int // index into Input.Jobs
	ID     string
	Lo, Hi int
	Final  bool
}

// Len is the piece's token count.
func (p Piece) Len() int { return p.Hi - p.Lo }

// Reject is a job that cannot run under the budget at all.
type Reject struct {
	Job    int
	ID     string
	Reason string
}

// Memory is a plan's peak memory by part, in bytes.
type Memory struct {
	Ring, Draining, States, Activations, Temporaries, Total, Budget int64
}

// Plan is one pass's decisions.
type Plan struct {
	Depth     int   // layers read ahead of compute
	SlotBytes int64 // one ring slot
	Tile      int   // rows per layer call
	Pieces    []Piece
	Tokens    int      // tokens in the pass (sum of pieces)
	Waiting   []string // jobs not in this pass for lack of memory (in order)
	Rejected  []Reject // jobs that can never fit the budget
	Mem       Memory
}

// ErrBudget is wrapped by the errors of budgets that cannot run a pass.
var ErrBudget = errors.New("memory budget too small")

// Make plans one pass. It errs only when no pass can run at all (the budget
// cannot hold the ring and one tile of work); jobs that alone exceed the
// budget are listed in Rejected, and jobs that must wait in Waiting.
func Make(in Input) (Plan, error) {
	c := in.Costs
	if c.Layers <= 0 || c.SlotBytes <= 0 || c.ActPerToken <= 0 {
		return Plan{}, fmt.Errorf("planner: incomplete costs (layers %d, slot %d, activation %d bytes/token)", c.Layers, c.SlotBytes, c.ActPerToken)
	}
	if in.Budget <= 0 {
		return Plan{}, fmt.Errorf("%w: budget %d bytes", ErrBudget, in.Budget)
	}
	maxTile := in.MaxTile
	if maxTile <= 0 {
		maxTile = DefaultMaxTile
	}
	maxTile = max(Align, maxTile-maxTile%Align)

	depth, err := chooseDepth(in)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Depth: depth, SlotBytes: c.SlotBytes, Tile: Align}
	p.Mem.Budget = in.Budget
	p.Mem.Ring = int64(depth+1) * c.SlotBytes
	p.Mem.Draining = max(in.Draining, 0)
	// Room for states, activations and temporaries: for good, and now,
	// while finished jobs' states drain to their sinks.
	whole := in.Budget - p.Mem.Ring
	room := whole - p.Mem.Draining

	// Admit jobs in order while their states and at least one aligned piece
	// (or the rest of the prompt) fit beside a minimal tile's temporaries.
	// A new job that does not fit stops later new jobs from overtaking it.
	// Jobs in progress hold their whole state already, in the pass or not.
	var used int64 // states + activations
	for _, j := range in.Jobs {
		if j.Done > 0 && j.Done < j.Total {
			used += c.State(j.Total)
		}
	}
	p.Mem.States = used
	seqs := 0
	blocked := false
	for i, j := range in.Jobs {
		rest := j.Total - j.Done
		if rest <= 0 {
			continue
		}
		st := c.State(j.Total)
		need := min(rest, Align)
		if alone := st + int64(need)*c.ActPerToken + c.Temps(Align, 1); j.Done == 0 && alone > whole {
			p.Rejected = append(p.Rejected, Reject{Job: i, ID: j.ID, Reason: fmt.Sprintf(
				"a prompt of %d tokens needs %s of state plus %s to run its first %d tokens, and the budget leaves %s beside the weight ring (%s)",
				j.Total, human(st), human(int64(need)*c.ActPerToken+c.Temps(Align, 1)), need, human(whole), human(p.Mem.Ring))})
			continue
		}
		if blocked && j.Done == 0 {
			p.Waiting = append(p.Waiting, j.ID)
			continue
		}
		if j.Done > 0 {
			st = 0 // counted above
		}
		free := room - used - st - c.Temps(Align, seqs+1)
		give := int64(0)
		if free > 0 {
			give = free / c.ActPerToken
		}
		n := min(rest, int(min(give, int64(rest))))
		if n < rest {
			n -= n % Align
		}
		if n <= 0 {
			p.Waiting = append(p.Waiting, j.ID)
			if j.Done == 0 {
				blocked = true
			}
			continue
		}
		used += st + int64(n)*c.ActPerToken
		seqs++
		p.Mem.States += st
		p.Pieces = append(p.Pieces, Piece{Job: i, ID: j.ID, Lo: j.Done, Hi: j.Done + n, Final: j.Done+n == j.Total})
		p.Tokens += n
	}
	if len(p.Pieces) == 0 {
		p.Mem.Total = p.Mem.Ring + p.Mem.Draining + p.Mem.States
		return p, nil
	}
	p.Mem.Activations = int64(p.Tokens) * c.ActPerToken

	// The tile: as many rows as the leftover memory allows, up to the
	// backend's limit and the pass's tokens, in multiples of Align.
	left := room - used - c.TempFixed - int64(seqs)*c.TempPerSeq
	tile := maxTile
	if c.TempPerRow > 0 {
		tile = int(min(int64(maxTile), left/c.TempPerRow))
	}
	tile = min(tile, roundUp(p.Tokens, Align))
	p.Tile = max(Align, tile-tile%Align)
	p.Mem.Temporaries = c.Temps(p.Tile, seqs)
	p.Mem.Total = p.Mem.Ring + p.Mem.Draining + p.Mem.States + p.Mem.Activations + p.Mem.Temporaries
	return p, nil
}

// chooseDepth returns the fixed depth when it fits. Otherwise it picks the
// deepest depth of at least 2 whose ring leaves a third of the budget for
// work, else 1 (double buffering: reads still overlap compute) or, on a
// budget that holds only one slot beside the least work, 0. Depth 2 absorbs
// the jitter of reads and compute that double buffering passes on: on the
// medium preset with compute close to read time it brought a pass from
// 1.18x to 1.06x of max(read-only, compute-only).
func chooseDepth(in Input) (int, error) {
	c := in.Costs
	// The least work a pass can do: one 64-token prompt. Jobs that need more
	// than the chosen ring leaves are rejected one by one, with their reason.
	minWork := c.State(Align) + Align*c.ActPerToken + c.Temps(Align, 1)
	fits := func(d int) bool { return int64(d+1)*c.SlotBytes+minWork <= in.Budget }
	if in.Depth >= 0 {
		if !fits(in.Depth) {
			return 0, fmt.Errorf("%w: depth %d needs a ring of %d x %s = %s plus %s of working memory, over the %s budget",
				ErrBudget, in.Depth, in.Depth+1, human(c.SlotBytes), human(int64(in.Depth+1)*c.SlotBytes), human(minWork), human(in.Budget))
		}
		return in.Depth, nil
	}
	maxDepth := in.MaxDepth
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	for d := maxDepth; d >= 2; d-- {
		if int64(d+1)*c.SlotBytes <= in.Budget*2/3 && fits(d) {
			return d, nil
		}
	}
	for d := min(1, maxDepth); d >= 0; d-- {
		if fits(d) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w: one layer slot (%s) plus %s of working memory exceeds the %s budget",
		ErrBudget, human(c.SlotBytes), human(minWork), human(in.Budget))
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

func human(n int64) string { return progress.HumanBytes(n) }

// String explains the plan in one line.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "depth %d (ring %d x %s = %s), ", p.Depth, p.Depth+1, human(p.SlotBytes), human(p.Mem.Ring))
	if len(p.Pieces) == 0 {
		b.WriteString("no job fits this pass")
	} else {
		fmt.Fprintf(&b, "%d tokens of %d jobs, tile %d rows: ", p.Tokens, len(p.Pieces), p.Tile)
		for i, pc := range p.Pieces {
			if i > 0 {
				b.WriteString(", ")
			}
			kind := "final"
			if !pc.Final {
				kind = "super-chunk"
			}
			fmt.Fprintf(&b, "%s [%d,%d) %s", pc.ID, pc.Lo, pc.Hi, kind)
		}
	}
	if len(p.Waiting) > 0 {
		fmt.Fprintf(&b, "; waiting: %s", strings.Join(p.Waiting, ", "))
	}
	for _, r := range p.Rejected {
		fmt.Fprintf(&b, "; rejected %s: %s", r.ID, r.Reason)
	}
	m := p.Mem
	fmt.Fprintf(&b, "; memory: ring %s + states %s + activations %s + temporaries %s", human(m.Ring), human(m.States), human(m.Activations), human(m.Temporaries))
	if m.Draining > 0 {
		fmt.Fprintf(&b, " + draining to sinks %s", human(m.Draining))
	}
	fmt.Fprintf(&b, " = %s of %s budget", human(m.Total), human(m.Budget))
	return b.String()
}
