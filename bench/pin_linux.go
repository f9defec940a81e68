package main

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// startPinned starts cmd restricted to one CPU: the core-th (modulo their
// count) of the CPUs this process may use, so that a bench started under
// taskset or a cpuset stays on its CPUs. A child inherits the affinity of
// the thread that forks it, and its threads inherit it in turn; so the
// fork is made from a thread of its own, pinned first and never returned
// to the scheduler (the goroutine ends locked to it, which ends the
// thread). A CPU that cannot be had is errNoPin.
func startPinned(cmd *exec.Cmd, core int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		var allowed, set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &allowed); err != nil || allowed.Count() == 0 {
			errc <- fmt.Errorf("%w: reading the allowed CPUs: %v", errNoPin, err)
			return
		}
		set.Set(nthCPU(&allowed, core%allowed.Count()))
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- fmt.Errorf("%w: pinning to core %d: %v", errNoPin, core, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// nthCPU is the n-th CPU set in s, counting from 0.
func nthCPU(s *unix.CPUSet, n int) int {
	for cpu := 0; ; cpu++ {
		if s.IsSet(cpu) {
			if n == 0 {
				return cpu
			}
			n--
		}
	}
}
