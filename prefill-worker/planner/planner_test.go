package planner

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

const MiB = 1 << 20

// costs is a small model: 8 layers of 10 MiB slots, 4 KiB of activations
// and 2 KiB of MLA cache per token, 1 MiB of fixed state, 20 KiB of
// temporaries per row.
func costs() Costs {
	return Costs{Layers: 8, SlotBytes: 10 * MiB, ActPerToken: 4096, StateFixed: MiB, StatePerToken: 2048,
		TempFixed: 2 * MiB, TempPerRow: 20 << 10, TempPerSeq: 256 << 10}
}

func TestMakeFitsEverything(t *testing.T) {
	p, err := Make(Input{Costs: costs(), Budget: 1 << 30, Depth: -1,
		Jobs: []Job{{ID: "a", Total: 100}, {ID: "b", Total: 3}, {ID: "c", Total: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Depth != DefaultMaxDepth {
		t.Errorf("depth %d, want %d with a budget that holds it easily", p.Depth, DefaultMaxDepth)
	}
	if len(p.Pieces) != 3 || p.Tokens != 1103 {
		t.Fatalf("pieces %+v, want all three jobs whole", p.Pieces)
	}
	for _, pc := range p.Pieces {
		if pc.Lo != 0 || !pc.Final {
			t.Errorf("piece %+v: want the whole prompt, final", pc)
		}
	}
	if p.Tile != 1152 { // the pass's 1103 tokens rounded up to 64
		t.Errorf("tile %d, want 1152", p.Tile)
	}
	if p.Mem.Total > p.Mem.Budget {
		t.Errorf("plan uses %d of %d bytes", p.Mem.Total, p.Mem.Budget)
	}
	s := p.String()
	for _, want := range []string{"depth 2", "1103 tokens of 3 jobs", "a [0,100) final", "of 1.0 GiB budget"} {
		if !strings.Contains(s, want) {
			t.Errorf("plan line %q lacks %q", s, want)
		}
	}
}

// TestMakeSuperChunks runs passes until every job is done, as the scheduler
// does, and checks every pass: within budget, pieces aligned to the KDA
// chunk from the prompt start, in-progress jobs served first, and every
// token prefilled exactly once.
func TestMakeSuperChunks(t *testing.T) {
	c := costs()
	// A depth-2 ring and 20 MiB of room: "long" alone takes 10.8 MiB of state
	// and leaves room for about 1400 tokens of activations per pass.
	budget := int64(3*10*MiB) + 20*MiB
	jobs := []Job{{ID: "long", Total: 5000}, {ID: "mid", Total: 700}, {ID: "short", Total: 10}}
	passes := 0
	for {
		var queue []Job
		for _, j := range jobs {
			if j.Done < j.Total && j.Done > 0 {
				queue = append(queue, j)
			}
		}
		for _, j := range jobs {
			if j.Done == 0 {
				queue = append(queue, j)
			}
		}
		if len(queue) == 0 {
			break
		}
		p, err := Make(Input{Costs: c, Budget: budget, Depth: 2, Jobs: queue})
		if err != nil {
			t.Fatal(err)
		}
		passes++
		if passes > 100 || len(p.Pieces) == 0 {
			t.Fatalf("pass %d makes no progress: %s", passes, p)
		}
		if p.Mem.Total > budget {
			t.Fatalf("pass %d uses %d bytes of a %d budget: %s", passes, p.Mem.Total, budget, p)
		}
		for _, pc := range p.Pieces {
			j := &jobs[indexOf(jobs, pc.ID)]
			if pc.Lo != j.Done || pc.Lo%Align != 0 || (!pc.Final && pc.Hi%Align != 0) || pc.Final != (pc.Hi == j.Total) {
				t.Fatalf("pass %d: piece %+v of job %+v is misaligned", passes, pc, *j)
			}
			j.Done = pc.Hi
		}
		t.Logf("pass %d: %s", passes, p)
		jobs = slicesDeleteDone(jobs)
	}
	if passes < 5 {
		t.Errorf("%d passes for 5710 tokens with room for ~1400 per pass; super-chunking did not happen", passes)
	}
}

func indexOf(jobs []Job, id string) int {
	for i, j := range jobs {
		if j.ID == id {
			return i
		}
	}
	panic(id)
}

func slicesDeleteDone(jobs []Job) []Job {
	out := jobs[:0]
	for _, j := range jobs {
		if j.Done < j.Total {
			out = append(out, j)
		}
	}
	return out
}

func TestMakeRandomStaysInBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		c := costs()
		c.SlotBytes = int64(1+r.IntN(64)) * MiB
		c.StatePerToken = int64(r.IntN(8192))
		budget := int64(r.IntN(1<<30)) + 1
		var jobs []Job
		for k := r.IntN(6); k >= 0; k-- {
			total := 1 + r.IntN(20000)
			done := 0
			if k%3 == 0 {
				done = r.IntN(total/Align+1) * Align
				if done == total {
					done = 0
				}
			}
			jobs = append(jobs, Job{ID: string(rune('a' + k)), Total: total, Done: done})
		}
		// In-progress jobs first, as the contract asks.
		var in []Job
		for _, j := range jobs {
			if j.Done > 0 {
				in = append(in, j)
			}
		}
		for _, j := range jobs {
			if j.Done == 0 {
				in = append(in, j)
			}
		}
		var held int64
		for _, j := range in {
			if j.Done > 0 {
				held += c.State(j.Total)
			}
		}
		p, err := Make(Input{Costs: c, Budget: budget, Depth: -1, Jobs: in})
		if err == nil && held+p.Mem.Ring > budget {
			continue // jobs in progress that could never have started under this budget
		}
		if err != nil {
			if !errors.Is(err, ErrBudget) {
				t.Fatalf("case %d: %v", i, err)
			}
			continue
		}
		if p.Mem.Total > budget {
			t.Fatalf("case %d: plan uses %d of %d: %s", i, p.Mem.Total, budget, p)
		}
		if got := int64(p.Depth+1) * c.SlotBytes; got != p.Mem.Ring {
			t.Fatalf("case %d: ring %d, want %d", i, p.Mem.Ring, got)
		}
		if p.Tile%Align != 0 || p.Tile < Align {
			t.Fatalf("case %d: tile %d", i, p.Tile)
		}
		seen := map[string]bool{}
		for _, pc := range p.Pieces {
			j := in[pc.Job]
			if seen[pc.ID] || pc.Lo != j.Done || pc.Hi > j.Total || pc.Len() <= 0 || (!pc.Final && pc.Hi%Align != 0) {
				t.Fatalf("case %d: bad piece %+v for %+v", i, pc, j)
			}
			seen[pc.ID] = true
		}
		if len(p.Pieces)+len(p.Waiting)+len(p.Rejected) != len(in) {
			t.Fatalf("case %d: %d jobs in, %d planned + %d waiting + %d rejected", i, len(in), len(p.Pieces), len(p.Waiting), len(p.Rejected))
		}
	}
}

func TestMakeDepth(t *testing.T) {
	c := costs()
	for _, tc := range []struct {
		budget int64
		depth  int
		want   int
		err    bool
	}{
		{budget: 1 << 30, depth: -1, want: 2},
		{budget: 50 * MiB, depth: -1, want: 2},   // 3 slots = 30 MiB <= 2/3 of 50 MiB
		{budget: 30 * MiB, depth: -1, want: 1},   // depth 2 does not fit; 1 does
		{budget: 40 * MiB, depth: -1, want: 1},   // depth 2 fits but its ring takes over 2/3
		{budget: 12 * MiB, depth: -1, err: true}, // one slot plus a minimal tile does not fit
		{budget: 1 << 30, depth: 0, want: 0},
		{budget: 1 << 30, depth: 5, want: 5},
		{budget: 40 * MiB, depth: 3, err: true},
	} {
		p, err := Make(Input{Costs: c, Budget: tc.budget, Depth: tc.depth, Jobs: []Job{{ID: "a", Total: 10}}})
		if tc.err {
			if !errors.Is(err, ErrBudget) {
				t.Errorf("budget %d depth %d: err %v, want ErrBudget", tc.budget, tc.depth, err)
			}
			continue
		}
		if err != nil || p.Depth != tc.want {
			t.Errorf("budget %d depth %d: got depth %d, err %v; want %d", tc.budget, tc.depth, p.Depth, err, tc.want)
		}
	}
}

func TestMakeRejectsAndWaits(t *testing.T) {
	c := costs()
	budget := int64(2*10*MiB) + 40*MiB
	// "huge" needs 1 MiB + 40000*2 KiB = 79 MiB of state: never fits. "big"
	// fits alone but not beside "first", and "small" must not overtake it.
	p, err := Make(Input{Costs: c, Budget: budget, Depth: 1, Jobs: []Job{
		{ID: "first", Total: 6000}, {ID: "huge", Total: 40000}, {ID: "big", Total: 9000}, {ID: "small", Total: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rejected) != 1 || p.Rejected[0].ID != "huge" || !strings.Contains(p.Rejected[0].Reason, "40000 tokens") {
		t.Errorf("rejected %+v, want huge with a reason naming its length", p.Rejected)
	}
	if len(p.Pieces) != 1 || p.Pieces[0].ID != "first" {
		t.Errorf("pieces %+v, want only first", p.Pieces)
	}
	if strings.Join(p.Waiting, ",") != "big,small" {
		t.Errorf("waiting %v, want big then small (no overtaking)", p.Waiting)
	}
}

func TestTiles(t *testing.T) {
	for _, tc := range []struct {
		lens []int
		tile int
		want []Range
	}{
		{[]int{10}, 64, []Range{{0, 10}}},
		{[]int{10, 20, 30}, 64, []Range{{0, 60}}},
		{[]int{200}, 64, []Range{{0, 64}, {64, 128}, {128, 192}, {192, 200}}},
		{[]int{40, 100}, 128, []Range{{0, 104}, {104, 140}}},          // piece 2 cut after 64 of its rows
		{[]int{100, 100}, 128, []Range{{0, 100}, {100, 200}}},         // 28 rows of room: piece 2 cannot be cut there
		{[]int{129, 5}, 100, []Range{{0, 64}, {64, 128}, {128, 134}}}, // tile rounded down to 64
	} {
		got := Tiles(tc.lens, tc.tile)
		if len(got) != len(tc.want) {
			t.Errorf("Tiles(%v, %d) = %v, want %v", tc.lens, tc.tile, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("Tiles(%v, %d) = %v, want %v", tc.lens, tc.tile, got, tc.want)
				break
			}
		}
	}
}

// TestTilesRandom checks the cutting rule on random layouts: tiles cover the
// rows in order, none exceeds the tile, and every cut inside a piece is at a
// multiple of Align from the piece start.
func TestTilesRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5000; i++ {
		lens := make([]int, 1+r.IntN(5))
		for k := range lens {
			lens[k] = 1 + r.IntN(400)
		}
		tile := Align * (1 + r.IntN(8))
		tiles := Tiles(lens, tile)
		starts := map[int]int{} // piece start row -> length
		off := 0
		for _, n := range lens {
			starts[off] = n
			off += n
		}
		pos := 0
		for _, tl := range tiles {
			if tl.Lo != pos || tl.Hi <= tl.Lo || tl.Hi-tl.Lo > tile {
				t.Fatalf("lens %v tile %d: bad tiles %v", lens, tile, tiles)
			}
			pos = tl.Hi
			// The cut at tl.Hi must be a piece boundary or aligned inside one.
			ps := 0
			for s, n := range starts {
				if s <= tl.Hi && tl.Hi < s+n && s > ps {
					ps = s
				}
			}
			if _, boundary := starts[tl.Hi]; !boundary && tl.Hi != off && (tl.Hi-ps)%Align != 0 {
				t.Fatalf("lens %v tile %d: cut at row %d is %d rows into a piece", lens, tile, tl.Hi, tl.Hi-ps)
			}
		}
		if pos != off {
			t.Fatalf("lens %v: tiles %v end at %d of %d rows", lens, tiles, pos, off)
		}
	}
}

// TestMakeDraining: memory still held by finished jobs' sink queues makes
// new jobs wait, never rejects them.
func TestMakeDraining(t *testing.T) {
	c := costs()
	budget := int64(2*10*MiB) + 12*MiB
	jobs := []Job{{ID: "a", Total: 500}}
	p, err := Make(Input{Costs: c, Budget: budget, Depth: 1, Jobs: jobs, Draining: 10 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Pieces) != 0 || len(p.Rejected) != 0 || len(p.Waiting) != 1 {
		t.Fatalf("with 10 MiB draining: %s; want job a waiting", p)
	}
	p, err = Make(Input{Costs: c, Budget: budget, Depth: 1, Jobs: jobs})
	if err != nil || len(p.Pieces) != 1 || !p.Pieces[0].Final {
		t.Fatalf("without draining: %s, %v; want job a whole", p, err)
	}
}

// TestNextTile: with no cost budget the calls are Tiles'; a budget ends a
// call at the step that would pass it (at least one step per call), cut
// only on the Align grid of each piece; a cost that grows with the
// position (attention) makes later calls shorter.
func TestNextTile(t *testing.T) {
	all := func(lens, starts []int, tile int, budget float64, cost func(int, int, int) float64) []Range {
		var out []Range
		total := 0
		for _, n := range lens {
			total += n
		}
		for from := 0; from < total; {
			r := NextTile(lens, starts, from, tile, budget, cost)
			if r.Lo != from || r.Hi <= r.Lo {
				t.Fatalf("NextTile from %d: %v", from, r)
			}
			out = append(out, r)
			from = r.Hi
		}
		return out
	}
	flat := func(_, lo, hi int) float64 { return float64(hi - lo) }
	lens, starts := []int{100, 300, 30, 700}, []int{0, 128, 0, 64}
	for _, tile := range []int{64, 128, 500, 4096} {
		if got, want := all(lens, starts, tile, math.Inf(1), flat), Tiles(lens, tile); !slices.Equal(got, want) {
			t.Errorf("tile %d: %v, Tiles gives %v", tile, got, want)
		}
	}
	// A budget of 200 rows' cost: calls of at most 200 rows, cut on the grid.
	for _, r := range all(lens, starts, 0, 200, flat) {
		if r.Hi-r.Lo > 200 {
			t.Errorf("call %v over the budget", r)
		}
	}
	// Attention-like cost: a step at position p costs p; each call stays
	// within the budget unless it is one step, and later calls are shorter.
	grow := func(_, lo, hi int) float64 { return float64(hi-lo) * float64(hi) }
	calls := all([]int{4096}, []int{0}, 0, 64*2048, grow)
	if len(calls) < 4 || calls[0].Hi-calls[0].Lo <= calls[len(calls)-1].Hi-calls[len(calls)-1].Lo {
		t.Fatalf("calls %v: want more than a few, shrinking", calls)
	}
	for _, r := range calls {
		if (r.Lo%Align != 0) || (r.Hi != 4096 && r.Hi%Align != 0) {
			t.Errorf("call %v off the grid", r)
		}
		c := 0.0
		for p := r.Lo; p < r.Hi; p += Align {
			c += grow(0, p, min(r.Hi, p+Align))
		}
		if c > 64*2048 && r.Hi-r.Lo > Align {
			t.Errorf("call %v costs %v, over the budget", r, c)
		}
	}
	if r := NextTile([]int{1000}, []int{0}, 0, 0, 1, flat); r != (Range{0, 64}) {
		t.Fatalf("a step over the budget alone: %v, want one step", r)
	}
}
