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

	"github.com/tandem-inference/tandem/internal/machine"
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
	s := l.span()
	return s.others, s.ok
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
// others' share of the cores; ok is false where they are not known.
func (l loadMeter) span() cpuSpan {
	m, s, ok := cpuTimes()
	wall := time.Since(l.start)
	if !ok || !l.ok || wall <= 0 {
		return cpuSpan{}
	}
	other := (m - l.machine) - (s - l.self)
	share := max(0, min(1, other.Seconds()/wall.Seconds()/float64(runtime.NumCPU())))
	return cpuSpan{self: s - l.self, others: share, ok: true}
}

// faultCounter counts the process's minor page faults by phase and knows
// what one costs on this machine, so that a run can say how much of its
// first jobs' time went to memory first touched (a cost the simulator does
// not model, and one a virtual machine can make large).
type faultCounter struct {
	last   int64
	ok     bool
	spans  map[string]int64
	phases []string // in the order first counted
	us     float64  // one fault, in microseconds; 0 where unknown
}

func newFaultCounter() *faultCounter {
	c := &faultCounter{spans: map[string]int64{}}
	if us, ok := machine.PageFaultMicros(); ok {
		c.us = us
	}
	c.last, c.ok = minorFaults()
	return c
}

// mark counts the faults since the previous mark (or the start) as
// phase's.
func (c *faultCounter) mark(phase string) {
	n, ok := minorFaults()
	if !c.ok || !ok {
		return
	}
	c.add(phase, n-c.last)
	c.last = n
}

// add counts n faults as phase's.
func (c *faultCounter) add(phase string, n int64) {
	if _, seen := c.spans[phase]; !seen {
		c.phases = append(c.phases, phase)
	}
	c.spans[phase] += n
}

// counts are the faults by phase, nil where none could be read.
func (c *faultCounter) counts() map[string]int64 {
	if len(c.spans) == 0 {
		return nil
	}
	return c.spans
}

// String is "; page faults: cold 312000 (4.4 s at 14.1 us each), ..." or
// empty where nothing was counted.
func (c *faultCounter) String() string {
	if len(c.phases) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("; page faults:")
	for i, p := range c.phases {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %d", p, c.spans[p])
		if c.us > 0 {
			fmt.Fprintf(&b, " (%.1f s at %.1f us each)", float64(c.spans[p])*c.us/1e6, c.us)
		}
	}
	return b.String()
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
