//go:build !linux

package main

import "os/exec"

// startPinned is not available off linux; the caller starts the process
// unpinned (it still runs with GOMAXPROCS 1).
func startPinned(cmd *exec.Cmd, core int) error { return errNoPin }
