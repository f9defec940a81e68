package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
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

// cpuSpan is what a timed run cost this process in CPU (user and system
// time of all its threads) and the share of the cores (0..1) that other
// processes used meanwhile. A run's CPU time, unlike its wall time, does
// not depend on how much of the machine it got.
type cpuSpan struct {
	self   time.Duration
	others float64
	ok     bool
}

// span reads the meter: the process's CPU time since it started and the
// others' share of the cores; ok is false where either is not known.
func (l loadMeter) span() cpuSpan {
	_, s, ok := cpuTimes()
	share, known := l.Others()
	if !ok || !l.ok || !known {
		return cpuSpan{}
	}
	return cpuSpan{self: s - l.self, others: share, ok: true}
}

// loadAverage is the machine's 1-minute load average sampled over a span:
// the run queue, which, unlike the others' share of the cores (capped at
// all of them), says how far past busy the machine was.
type loadAverage struct {
	Min     float64 `json:"min"`
	Mean    float64 `json:"mean"`
	Max     float64 `json:"max"`
	Samples int     `json:"samples"`
}

// add counts one sample.
func (a *loadAverage) add(v float64) { a.merge(loadAverage{Min: v, Mean: v, Max: v, Samples: 1}) }

// merge joins b's samples to a's.
func (a *loadAverage) merge(b loadAverage) {
	switch {
	case b.Samples == 0:
		return
	case a.Samples == 0:
		*a = b
		return
	}
	n := a.Samples + b.Samples
	a.Mean = (a.Mean*float64(a.Samples) + b.Mean*float64(b.Samples)) / float64(n)
	a.Min, a.Max, a.Samples = min(a.Min, b.Min), max(a.Max, b.Max), n
}

// String is "mean (min-max)".
func (a loadAverage) String() string {
	return fmt.Sprintf("%.1f (%.1f-%.1f)", a.Mean, a.Min, a.Max)
}

// parseLoadAvg reads the 1-minute figure of /proc/loadavg's text.
func parseLoadAvg(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("/proc/loadavg: empty")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("/proc/loadavg: %q is not a load average", f[0])
	}
	return v, nil
}

// loadEvery is how often bench e2e samples the load average.
const loadEvery = 10 * time.Second

// loadSampler samples the load average in the background until Stop.
type loadSampler struct {
	once sync.Once
	stop chan struct{}
	done chan struct{}
	avg  loadAverage // written by the sampling goroutine until done closes
}

// sampleLoad samples now and then every interval; where the load average
// cannot be read it records nothing.
func sampleLoad(every time.Duration) *loadSampler {
	s := &loadSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if v, ok := loadAvg(); ok {
				s.avg.add(v)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling (with one last sample) and returns the figures;
// ok is false where none could be read. It may be called again.
func (s *loadSampler) Stop() (loadAverage, bool) {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	a := s.avg
	if v, ok := loadAvg(); ok {
		a.add(v)
	}
	return a, a.Samples > 0
}
