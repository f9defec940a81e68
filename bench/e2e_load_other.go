//go:build !linux

package main

import "time"

// cpuTimes is unknown here: the machine's load is not reported.
func cpuTimes() (machine, self time.Duration, ok bool) { return 0, 0, false }

// loadAvg is unknown here.
func loadAvg() (float64, bool) { return 0, false }

// minorFaults is unknown here.
func minorFaults() (int64, bool) { return 0, false }
