package rss

import (
	"errors"
	"runtime"
	"testing"
)

func TestPeak(t *testing.T) {
	p, err := Peak()
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil || p < 1<<20 || p > 1<<40 {
		t.Fatalf("peak %d, %v", p, err)
	}
	// Touch 64 MiB more than the peak so far: the peak must grow past it.
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	q, _ := Peak()
	if q < 64<<20 {
		t.Fatalf("peak %d before, %d after touching 64 MiB", p, q)
	}
	runtime.KeepAlive(b)
}
