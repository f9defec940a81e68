//go:build !linux && !darwin

package rss

func peakSelf() (int64, error) { return 0, ErrUnsupported }
