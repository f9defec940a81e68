//go:build race

package main

// raceEnabled: the race detector slows the model math about tenfold, so the
// small-model process runs are left to the normal test run.
const raceEnabled = true
