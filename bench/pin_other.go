//go:build !linux

package main

// pinProcess is not available off linux; the ranks still run with
// GOMAXPROCS 1.
func pinProcess(core int) error { return errNoPin }
