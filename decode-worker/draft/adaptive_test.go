package draft

import (
	"math"
	"testing"
	"time"
)

func TestAdaptive(t *testing.T) {
	type step struct{ drafted, accepted, wantK int }
	for _, tc := range []struct {
		name  string
		kMax  int
		steps []step
	}{
		{"grows on full acceptance to kMax", 4, []step{{2, 2, 3}, {3, 3, 4}, {4, 4, 4}}},
		{"shrinks by one on a late rejection", 6, []step{{2, 2, 3}, {3, 3, 4}, {4, 3, 3}}},
		{"falls to accepted+1", 6, []step{{2, 2, 3}, {3, 3, 4}, {4, 4, 5}, {5, 1, 2}}},
		{"at least 1 while the rate holds", 4, []step{{2, 0, 1}}},
		{"stops under the floor, probes after 3 idle steps", 4, []step{
			{2, 0, 1}, {1, 0, 1}, {1, 0, 0}, // rate 0.26 then 0.18 < 0.2
			{0, 0, 0}, {0, 0, 0}, {0, 0, 1}, // probe
			{1, 1, 2}, // rate back to 0.35
		}},
		{"kMax 0 never drafts", 0, []step{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
		{"accepted clamped to drafted", 4, []step{{2, 9, 3}}},
	} {
		a := NewAdaptive(tc.kMax, 0.9, 0.2, 3)
		if want := min(2, tc.kMax); a.K() != want {
			t.Errorf("%s: starts at %d, want %d", tc.name, a.K(), want)
		}
		for i, s := range tc.steps {
			a.Observe(s.drafted, s.accepted)
			if a.K() != s.wantK {
				t.Errorf("%s: step %d (%d of %d): k %d, want %d (rate %.3f)", tc.name, i, s.accepted, s.drafted, a.K(), s.wantK, a.Rate())
				break
			}
		}
	}
}

func TestAdaptiveRate(t *testing.T) {
	// Geometric draws at a = 0.7, k = 4: the estimate converges near a.
	a := NewAdaptive(4, 0.99, 0, 1)
	u := uint64(1)
	for range 20000 {
		acc := 0
		for acc < 4 {
			u = u*6364136223846793005 + 1442695040888963407
			if float64(u>>11)/(1<<53) >= 0.7 {
				break
			}
			acc++
		}
		a.Observe(4, acc)
	}
	if r := a.Rate(); math.Abs(r-0.7) > 0.05 {
		t.Errorf("rate %.3f, want 0.7 within 0.05 (decay 0.99 keeps about 100 steps)", r)
	}
}

func TestExpected(t *testing.T) {
	for _, a := range []float64{0, 0.3, 0.5, 0.9} {
		for k := range 8 {
			closed := (1 - math.Pow(a, float64(k+1))) / (1 - a)
			if got := Expected(k, a); math.Abs(got-closed) > 1e-12 {
				t.Errorf("Expected(%d, %v) = %v, closed form %v", k, a, got, closed)
			}
		}
	}
	if Expected(5, 1) != 6 || Expected(3, 2) != 4 || Expected(-1, 0.5) != 1 {
		t.Error("Expected: a = 1 must give k+1, a clamps to [0, 1], k to >= 0")
	}
}

func TestWorthAndBest(t *testing.T) {
	ms := time.Millisecond
	flat := func(int) time.Duration { return 10 * ms }                   // memory-bound step
	linear := func(r int) time.Duration { return time.Duration(r) * ms } // compute-bound
	affine := func(r int) time.Duration { return 10*ms + time.Duration(r)*ms }
	knee := func(r int) time.Duration { // flat to 4 rows, then steep
		if r <= 4 {
			return 10 * ms
		}
		return time.Duration(10+20*(r-4)) * ms
	}
	free := func(int) time.Duration { return 0 }
	for _, tc := range []struct {
		name  string
		cost  func(int) time.Duration
		k     int
		a     float64
		worth bool
		best  int // Best(k, cost, a)
	}{
		{"flat cost, any acceptance", flat, 4, 0.1, true, 4},
		{"flat cost, none accepted", flat, 4, 0, false, 0},
		{"linear cost never pays", linear, 4, 0.99, false, 0},
		{"linear cost, certain acceptance ties", linear, 4, 1, false, 0},
		{"affine, good acceptance", affine, 2, 0.5, true, 2},   // 1.75*11 > 13
		{"affine, poor acceptance", affine, 2, 0.1, false, 1},  // k=2: 1.11*11 < 13; k=1: 1.1*11 > 12
		{"affine, best k below kMax", affine, 8, 0.6, true, 3}, // E/c peaks at k=3: 2.176/14
		{"knee caps k", knee, 6, 0.9, false, 3},                // k=6: 5.22*10 < 70; k=3: 3.44 per 10
		{"k 0 is plain decoding", flat, 0, 0.9, false, 0},
		{"no cost known", free, 4, 0.9, false, 0},
	} {
		if got := Worth(tc.k, tc.cost, tc.a); got != tc.worth {
			t.Errorf("%s: Worth(%d, a=%v) = %v", tc.name, tc.k, tc.a, got)
		}
		if got := Best(tc.k, tc.cost, tc.a); got != tc.best {
			t.Errorf("%s: Best(%d, a=%v) = %d, want %d", tc.name, tc.k, tc.a, got, tc.best)
		}
	}
	a := NewAdaptive(6, 0.9, 0.1, 4)
	for range 5 {
		a.Observe(a.K(), a.K())
	}
	if a.K() != 6 || a.Plan(knee) != 3 || a.Plan(linear) != 0 {
		t.Errorf("Plan: k %d, knee %d, linear %d; want 6, 3, 0", a.K(), a.Plan(knee), a.Plan(linear))
	}
}
