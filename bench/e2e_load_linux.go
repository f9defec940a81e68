//go:build linux

package main

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes reads the machine's busy CPU time (all cores, from /proc/stat)
// and this process's own (user and system).
func cpuTimes() (machine, self time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	if !sc.Scan() {
		return 0, 0, false
	}
	f := strings.Fields(sc.Text())
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	var busy int64
	for i, s := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		busy += v
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	// /proc/stat counts in USER_HZ, 100 a second on every Linux port Go
	// supports.
	return time.Duration(busy) * (time.Second / 100), self, true
}

// loadAvg is the machine's 1-minute load average.
func loadAvg() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	v, err := parseLoadAvg(b)
	return v, err == nil
}

// minorFaults is the number of page faults this process took that needed
// no disk read: first touches of fresh memory, mostly.
func minorFaults() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Minflt, true
}
