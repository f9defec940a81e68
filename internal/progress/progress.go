// Package progress prints throttled progress lines for long work (model
// generation, weight passes, transfers) to a terminal or log.
package progress

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Bytes reports done/total bytes with rate and ETA, at most every interval.
type Bytes struct {
	w        io.Writer
	label    string
	interval time.Duration
	start    time.Time
	now      func() time.Time // the clock; tests set their own

	mu   sync.Mutex
	last time.Time
}

// NewBytes starts a byte progress reporter.
func NewBytes(w io.Writer, label string) *Bytes {
	now := time.Now()
	return &Bytes{w: w, label: label, interval: time.Second, start: now, last: now, now: time.Now}
}

// Update records progress; it prints when the interval has passed or the
// work is complete. Safe for concurrent use.
func (p *Bytes) Update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if done < total && now.Sub(p.last) < p.interval {
		return
	}
	p.last = now
	el := now.Sub(p.start).Seconds()
	rate := float64(done) / max(el, 1e-9)
	eta := "-"
	if rate > 0 && done < total {
		eta = time.Duration(float64(total-done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	pct := 100 * float64(done) / float64(max(total, 1))
	fmt.Fprintf(p.w, "%s: %s / %s (%.0f%%), %s/s, ETA %s\n", p.label, HumanBytes(done), HumanBytes(total), pct, HumanBytes(int64(rate)), eta)
}

// HumanBytes formats n with a binary unit.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
