package pipeline

import (
	"slices"
	"testing"
	"time"
)

// The head's and the last rank's pure rules of speculative decoding.

func TestCostCurve(t *testing.T) {
	var c costCurve
	if c.at(1) != 0 || c.at(5) != 0 {
		t.Fatal("an empty curve has a cost")
	}
	c.observe(2, 10*time.Millisecond)
	c.observe(0, time.Second)         // no rows: ignored
	c.observe(curveRows, time.Second) // past the curve: ignored
	c.observe(3, -time.Millisecond)   // not a cost: ignored
	for _, tc := range []struct {
		rows int
		want time.Duration
	}{{1, 0}, {2, 10 * time.Millisecond}, {3, 10 * time.Millisecond}, {9, 10 * time.Millisecond}} {
		if got := c.at(tc.rows); got != tc.want {
			t.Errorf("at(%d) = %v, want %v (measured, else the nearest measured below)", tc.rows, got, tc.want)
		}
	}
	c.observe(2, 20*time.Millisecond) // moves a fifth of the way
	if got, want := c.at(2), 12*time.Millisecond; got != want {
		t.Errorf("after a second measurement at(2) = %v, want %v", got, want)
	}
	c.observe(4, 30*time.Millisecond)
	if got, want := c.at(5), 30*time.Millisecond; got != want {
		t.Errorf("at(5) = %v, want %v", got, want)
	}
}

func TestDraftBudget(t *testing.T) {
	for _, tc := range []struct{ kMax, emitted, max, want int }{
		{4, 0, 100, 4},
		{4, 95, 100, 4}, // 4 drafts and the token after them: 100
		{4, 96, 100, 3},
		{4, 99, 100, 0}, // one token left: no room for a draft
		{4, 100, 100, 0},
		{0, 0, 100, 0},
	} {
		if got := draftBudget(tc.kMax, tc.emitted, tc.max); got != tc.want {
			t.Errorf("draftBudget(%d, %d, %d) = %d, want %d", tc.kMax, tc.emitted, tc.max, got, tc.want)
		}
	}
}

func TestEmitted(t *testing.T) {
	sent := []int32{7, 8, 9}
	for _, tc := range []struct {
		accepted []int32
		token    int32
		want     []int32
		bad      bool
	}{
		{nil, 5, []int32{5}, false},
		{[]int32{7}, 5, []int32{7, 5}, false},
		{[]int32{7, 8, 9}, 5, []int32{7, 8, 9, 5}, false},
		{[]int32{7, 9}, 5, nil, true},        // not what the head drafted
		{[]int32{7, 8, 9, 10}, 5, nil, true}, // more than it drafted
	} {
		got, err := emitted(tc.accepted, tc.token, sent)
		if (err != nil) != tc.bad || !slices.Equal(got, tc.want) {
			t.Errorf("emitted(%v, %d) = %v, %v; want %v (error %v)", tc.accepted, tc.token, got, err, tc.want, tc.bad)
		}
	}
	if _, err := emitted([]int32{1}, 2, nil); err == nil {
		t.Error("an accepted token without a draft was taken")
	}
}

func TestCutRun(t *testing.T) {
	stop := map[int32]bool{9: true}
	for _, tc := range []struct {
		run                   []int32
		ended, generated, max int
		cut                   int
		why                   Reason
	}{
		{[]int32{1, 2, 3}, -1, 0, 10, -1, ""},
		{[]int32{1, 9, 3}, -1, 0, 10, 1, ReasonStop},   // a stop token inside the run
		{[]int32{1, 2, 3}, 1, 0, 10, 1, ReasonStop},    // the grammar's reply ended there
		{[]int32{1, 2, 3}, -1, 8, 10, 1, ReasonLength}, // the limit inside the run
		{[]int32{1, 2, 9}, -1, 7, 10, 2, ReasonStop},   // a stop token at the limit is a stop
		{[]int32{1, 2, 3}, -1, 7, 10, 2, ReasonLength}, // the limit at the run's end
	} {
		cut, why := cutRun(tc.run, stop, tc.ended, tc.generated, tc.max)
		if cut != tc.cut || why != tc.why {
			t.Errorf("cutRun(%v, ended %d, generated %d, max %d) = %d %q, want %d %q", tc.run, tc.ended, tc.generated, tc.max, cut, why, tc.cut, tc.why)
		}
	}
}
