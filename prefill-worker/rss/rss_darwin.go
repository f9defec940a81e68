//go:build darwin

package rss

import "syscall"

// peakSelf is ru_maxrss, in bytes on macOS (exec'd children start afresh:
// Go spawns them with posix_spawn).
func peakSelf() (int64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return int64(ru.Maxrss), nil
}
