package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand, so that rates and ETAs do
// not depend on how fast the machine runs the test.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestBytes(out *bytes.Buffer) (*Bytes, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewBytes(out, "gen")
	p.now = clk.now
	p.start, p.last = clk.t, clk.t
	return p, clk
}

func TestBytesETA(t *testing.T) {
	var out bytes.Buffer
	p, clk := newTestBytes(&out)
	// A quarter done after 10 s: 30 s to go.
	clk.advance(10 * time.Second)
	p.Update(1<<30, 4<<30)
	line := out.String()
	if !strings.Contains(line, "gen: 1.0 GiB / 4.0 GiB (25%), 102.4 MiB/s, ETA 30s") {
		t.Errorf("progress line %q: want done/total, percent, rate and ETA 30s", line)
	}
	out.Reset()
	p.Update(4<<30, 4<<30)
	if !strings.Contains(out.String(), "ETA -") {
		t.Errorf("finished progress line %q: want ETA -", out.String())
	}
}

// TestBytesThrottles: a line at most once per interval, except the final
// one, which always prints.
func TestBytesThrottles(t *testing.T) {
	var out bytes.Buffer
	p, clk := newTestBytes(&out)
	clk.advance(999 * time.Millisecond)
	p.Update(1, 10)
	if out.Len() != 0 {
		t.Fatalf("printed %q before the interval passed", out.String())
	}
	clk.advance(time.Millisecond)
	p.Update(2, 10)
	clk.advance(500 * time.Millisecond)
	p.Update(3, 10)
	if n := strings.Count(out.String(), "\n"); n != 1 || !strings.Contains(out.String(), "2 B / 10 B (20%)") {
		t.Fatalf("lines %q: want one, at 2 of 10 bytes", out.String())
	}
	p.Update(10, 10)
	if n := strings.Count(out.String(), "\n"); n != 2 || !strings.Contains(out.String(), "10 B / 10 B (100%)") {
		t.Fatalf("lines %q: want the final line printed at once", out.String())
	}
}
