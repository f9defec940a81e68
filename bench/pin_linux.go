package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinProcess restricts every thread of the process to CPU core (modulo
// the machine's CPUs); threads started later inherit it from their
// creators.
func pinProcess(core int) error {
	var set unix.CPUSet
	set.Set(core % runtime.NumCPU())
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("pinning to core %d: %w", core, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("pinning thread %d to core %d: %w", tid, core, err)
		}
	}
	return nil
}
