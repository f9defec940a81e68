package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBytesETA(t *testing.T) {
	var out bytes.Buffer
	p := NewBytes(&out, "gen")
	// A quarter done after 10 s: 30 s to go.
	p.start = time.Now().Add(-10 * time.Second)
	p.last = p.start
	p.Update(1<<30, 4<<30)
	line := out.String()
	if !strings.Contains(line, "1.0 GiB / 4.0 GiB (25%)") {
		t.Errorf("progress line %q: want done/total and percent", line)
	}
	if !strings.Contains(line, "ETA 30s") {
		t.Errorf("progress line %q: want ETA 30s", line)
	}
	out.Reset()
	p.Update(4<<30, 4<<30)
	if !strings.Contains(out.String(), "ETA -") {
		t.Errorf("finished progress line %q: want ETA -", out.String())
	}
}
