//go:build !linux

package main

import (
	"fmt"
	"os/exec"
)

// startPinned is not available off linux; the caller starts the process
// unpinned (it still runs with GOMAXPROCS 1).
func startPinned(cmd *exec.Cmd, core int) error {
	return fmt.Errorf("%w: pinning a process to a core needs linux", errNoPin)
}
