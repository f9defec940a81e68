package pipeline

import (
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/model"
)

func TestPickSlot(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		max   int
		want  int
	}{
		{[]int{0, 0, 0}, 4, 0},    // a tie: the first
		{[]int{2, 1, 3}, 4, 1},    // the smallest
		{[]int{4, 4, 3}, 4, 2},    // the only one with room
		{[]int{4, 4, 4}, 4, -1},   // full: wait
		{[]int{}, 4, -1},          // no slots
		{[]int{1, 0}, 1, 1},       // batches of one
		{[]int{5, 2, 2, 6}, 4, 1}, // over the limit (a smaller MaxBatch after a restart) never wins
	} {
		if got := pickSlot(tc.sizes, tc.max); got != tc.want {
			t.Errorf("pickSlot(%v, %d) = %d, want %d", tc.sizes, tc.max, got, tc.want)
		}
	}
}

func TestPrefillRows(t *testing.T) {
	c := model.KDAChunk
	for _, tc := range []struct {
		name         string
		pending, pos []int
		budget       int
		want         []int
	}{
		{"no budget: every prompt whole", []int{300, 5, 70}, []int{0, 0, 0}, 0, []int{300, 5, 70}},
		{"fits", []int{10, 20}, []int{0, 0}, 64, []int{10, 20}},
		{"the budget spent exactly stops the step", []int{32, 32, 9}, []int{0, 0, 0}, 64, []int{32, 32}},
		{"a long prompt is cut on the KDA grid", []int{1000}, []int{0}, 2*c + 10, []int{2 * c}},
		{"counted from the sequence's start", []int{1000}, []int{c + 7}, c + 20, []int{c - 7}},
		{"a cut that cannot reach the next multiple stops the step", []int{10, 500}, []int{0, 3}, 60, []int{10}},
		{"a short prompt after a cut one is not taken", []int{500, 5}, []int{0, 0}, c, []int{c}},
		{"nothing queued", nil, nil, 64, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := prefillRows(tc.pending, tc.pos, nil, tc.budget)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("prefillRows(%v, %v, %d) = %v, want %v", tc.pending, tc.pos, tc.budget, got, tc.want)
			}
			sum := 0
			for i, n := range got {
				sum += n
				if n <= 0 || n > tc.pending[i] {
					t.Fatalf("row count %d of sequence %d with %d pending", n, i, tc.pending[i])
				}
				if n < tc.pending[i] && (tc.pos[i]+n)%c != 0 {
					t.Fatalf("sequence %d cut at %d, off the KDA grid", i, tc.pos[i]+n)
				}
			}
			if tc.budget > 0 && sum > tc.budget {
				t.Fatalf("%d rows over the budget %d", sum, tc.budget)
			}
		})
	}
}

func TestPrefillDue(t *testing.T) {
	if prefillDue(0, 0, 2) || !prefillDue(1, 1, 2) || prefillDue(3, 2, 2) {
		t.Fatal("a prefill step goes when prompts wait and fewer than maxSteps are in flight")
	}
}

func TestResetDirections(t *testing.T) {
	// A lost downstream link: the Reset goes upstream, away from it.
	if up, down := resetLinks(mesh.Downstream); !up || down {
		t.Fatalf("lost downstream: up %v down %v", up, down)
	}
	if up, down := resetLinks(mesh.Upstream); up || !down {
		t.Fatalf("lost upstream: up %v down %v", up, down)
	}
	if up, down := resetLinks(0); !up || !down {
		t.Fatalf("a stalled step resets both ways: up %v down %v", up, down)
	}
	// A Reset goes on the way it travels.
	if up, down := passReset(mesh.Downstream); !up || down {
		t.Fatalf("from downstream: up %v down %v", up, down)
	}
	if up, down := passReset(mesh.Upstream); up || !down {
		t.Fatalf("from upstream: up %v down %v", up, down)
	}
	// In a ring of 4: rank 0's upstream is 3, rank 3's downstream is 0.
	if peerOf(0, 4, mesh.Upstream) != 3 || peerOf(3, 4, mesh.Downstream) != 0 || peerOf(1, 4, mesh.Downstream) != 2 {
		t.Fatal("peerOf")
	}
	if peerOf(0, 1, mesh.Upstream) != 0 {
		t.Fatal("a group of one is its own peer")
	}
}

func TestStalledStep(t *testing.T) {
	now := time.Unix(100, 0)
	launched := map[uint64]time.Time{1: now.Add(-time.Second), 2: now.Add(-3 * time.Second)}
	if id, ok := stalledStep(launched, now, 2*time.Second); !ok || id != 2 {
		t.Fatalf("stalled %d %v, want step 2", id, ok)
	}
	if _, ok := stalledStep(launched, now, 3*time.Second); ok {
		t.Fatal("a step exactly at the timeout is not stalled yet")
	}
	if _, ok := stalledStep(nil, now, time.Second); ok {
		t.Fatal("nothing in flight")
	}
}

func TestOnFormAction(t *testing.T) {
	for _, tc := range []struct {
		head, formed bool
		msg, mine    uint64
		holding      int
		want         formAction
	}{
		{true, false, 3, 3, 0, formRingFormed},
		{true, true, 3, 3, 0, formIgnore},  // formed already
		{true, false, 2, 3, 0, formIgnore}, // an older ring's Form
		{false, false, 3, 3, 0, formJoin},
		{false, true, 4, 3, 0, formJoin},      // a new ring, nothing held
		{false, true, 4, 3, 2, formJoinReset}, // a new ring: the old ring's sequences go
		{false, true, 3, 3, 2, formJoin},      // the same ring again
	} {
		if got := onFormAction(tc.head, tc.formed, tc.msg, tc.mine, tc.holding); got != tc.want {
			t.Errorf("onFormAction(%+v) = %d, want %d", tc, got, tc.want)
		}
	}
}

func TestStartable(t *testing.T) {
	if !startable(false, 0, 3) || startable(true, 2, 3) || !startable(true, 3, 3) {
		t.Fatal("a local sequence starts at once, a remote one when every rank holds its state")
	}
}

// TestPrefillRowsStops: a planned prefix-cache snapshot ends a sequence's
// share of a step at its position (so the state can be kept there), and
// the step goes on with the next sequence.
func TestPrefillRowsStops(t *testing.T) {
	c := model.KDAChunk
	for _, tc := range []struct {
		name                string
		pending, pos, stops []int
		budget              int
		want                []int
	}{
		{"a stop inside the share ends it", []int{149}, []int{0}, []int{2 * c}, 0, []int{2 * c}},
		{"the next sequence follows", []int{149, 20}, []int{0, 0}, []int{2 * c, 0}, 0, []int{2 * c, 20}},
		{"a stop at or behind the position is none", []int{21}, []int{2 * c}, []int{2 * c}, 0, []int{21}},
		{"a stop past the share changes nothing", []int{100}, []int{0}, []int{3 * c}, 0, []int{100}},
		{"the budget still cuts first", []int{300}, []int{0}, []int{4 * c}, 2 * c, []int{2 * c}},
		{"a stop under the budget", []int{300, 10}, []int{c, 0}, []int{2 * c, 0}, 4 * c, []int{c, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := prefillRows(tc.pending, tc.pos, tc.stops, tc.budget); !slices.Equal(got, tc.want) {
				t.Fatalf("prefillRows(%v, %v, %v, %d) = %v, want %v", tc.pending, tc.pos, tc.stops, tc.budget, got, tc.want)
			}
		})
	}
}

// The router prices a local prompt in the steps costmodel.LocalSteps plans
// from the group's chunk and its cache's snapshots: the head's own plan
// (prefillRows, stopping at prefixcache.NextStop) for a prompt alone.
func TestPrefillStepsAsTheRouterPricesThem(t *testing.T) {
	c := model.KDAChunk
	for _, chunk := range []int{0, c, 8 * c} {
		for _, stride := range []int{0, 3 * c, 16 * c} {
			for _, from := range []int{0, c, 5 * c} {
				for _, end := range []int{1, c - 1, c, 4*c - 1, 4 * c, 1023, 4095, 5000} {
					if end <= from {
						continue
					}
					plan := prefixcache.Snapshots(from, end, stride)
					var head []costmodel.Span
					for pos := from; pos < end; {
						rows := prefillRows([]int{end - pos}, []int{pos}, []int{prefixcache.NextStop(plan, pos)}, chunk)
						if len(rows) != 1 {
							t.Fatalf("chunk %d stride %d: %d..%d: the head planned %v at %d", chunk, stride, from, end, rows, pos)
						}
						head = append(head, costmodel.Span{Lo: pos, Hi: pos + rows[0]})
						pos += rows[0]
					}
					if got := costmodel.LocalSteps(from, end, chunk, plan); !slices.Equal(got, head) {
						t.Errorf("chunk %d stride %d: %d..%d: priced as %v, the head runs %v", chunk, stride, from, end, got, head)
					}
				}
			}
		}
	}
}
