package main

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// startPinned starts cmd restricted to CPU core (modulo the machine's
// CPUs). A child inherits the affinity of the thread that forks it, and its
// threads inherit it in turn; so the fork is made from a thread of its own,
// pinned first and never returned to the scheduler (the goroutine ends
// locked to it, which ends the thread).
func startPinned(cmd *exec.Cmd, core int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		var set unix.CPUSet
		set.Set(core % runtime.NumCPU())
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- fmt.Errorf("pinning to core %d: %w", core, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
