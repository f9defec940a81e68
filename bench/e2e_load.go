package main

import (
	"runtime"
	"time"
)

// loadMeter measures how busy the rest of the machine was over a span:
// the cores' busy time less this process's own, as a share of every core.
// The system under test shares the machine; a replay that ran while
// something else took the cores is slower for that reason, and says so.
type loadMeter struct {
	start         time.Time
	machine, self time.Duration
	ok            bool
}

func startLoad() loadMeter {
	m, s, ok := cpuTimes()
	return loadMeter{start: time.Now(), machine: m, self: s, ok: ok}
}

// Others is the share of the machine's cores (0..1) used by other
// processes since the meter started; ok is false where it is not known.
func (l loadMeter) Others() (share float64, ok bool) {
	m, s, ok := cpuTimes()
	wall := time.Since(l.start)
	if !ok || !l.ok || wall <= 0 {
		return 0, false
	}
	other := (m - l.machine) - (s - l.self)
	return max(0, min(1, other.Seconds()/wall.Seconds()/float64(runtime.NumCPU()))), true
}
