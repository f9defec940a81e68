package sim

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestLoopRunsInTimeOrderAndTiesInScheduleOrder(t *testing.T) {
	var l Loop
	var got []string
	rec := func(s string) func() {
		return func() { got = append(got, s+"@"+l.Now().String()) }
	}
	l.At(3*time.Second, rec("c"))
	l.At(1*time.Second, rec("a1"))
	l.At(1*time.Second, rec("a2"))
	l.At(2*time.Second, func() {
		got = append(got, "b@"+l.Now().String())
		l.After(0, rec("b-now"))                 // same time, after everything already at 2s
		l.At(time.Second, rec("b-past"))         // the past means now
		l.After(500*time.Millisecond, rec("b+")) // before c
	})
	l.At(2*time.Second, rec("b2"))
	if err := l.Run(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	want := "a1@1s a2@1s b@2s b2@2s b-now@2s b-past@2s b+@2.5s c@3s"
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("order\n got %s\nwant %s", s, want)
	}
	if l.Ran() != 8 || l.Pending() != 0 {
		t.Fatalf("ran %d, pending %d", l.Ran(), l.Pending())
	}
}

func TestLoopStopsARunawayModelAndOnCancel(t *testing.T) {
	var l Loop
	var tick func()
	tick = func() { l.After(time.Second, tick) }
	l.At(0, tick)
	err := l.Run(context.Background(), 100)
	if err == nil || !strings.Contains(err.Error(), "stopped after 100 events") {
		t.Fatalf("runaway model: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var m Loop
	m.At(0, func() { t.Error("ran an action after the context ended") })
	if err := m.Run(ctx, 0); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("cancelled run: %v", err)
	}
}
