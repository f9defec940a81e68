package main

import (
	"hash/crc32"
	"slices"
	"testing"
	"time"
)

// TestPairRatios: each rep's ratio is its raw time over its transfer time
// (the transfer's throughput as a fraction of the raw wire's), and the
// median is taken over the pairs, not over best times: a rep in which the
// machine slowed both runs gives the same ratio as a quiet one.
func TestPairRatios(t *testing.T) {
	ms := time.Millisecond
	raw := []time.Duration{100 * ms, 200 * ms, 50 * ms}
	xfer := []time.Duration{200 * ms, 250 * ms, 500 * ms}
	rs, med := pairRatios(raw, xfer)
	if want := []float64{0.5, 0.8, 0.1}; !slices.Equal(rs, want) {
		t.Fatalf("ratios %v, want %v", rs, want)
	}
	if med != 0.5 {
		t.Fatalf("median %v, want 0.5", med)
	}
	// Best raw over best transfer would say 50/200 = 0.25: the pairs do not
	// mix one rep's raw with another's transfer.
	rs, med = pairRatios([]time.Duration{100 * ms, 0, 300 * ms, 100 * ms}, []time.Duration{100 * ms, 100 * ms, 200 * ms})
	if want := []float64{1, 1.5}; !slices.Equal(rs, want) || med != 1.25 {
		t.Fatalf("with a missing time and an unpaired rep: ratios %v median %v, want %v and 1.25", rs, med, want)
	}
	if rs, med := pairRatios(nil, nil); rs != nil || med != 0 {
		t.Fatalf("no reps: %v %v", rs, med)
	}
}

// TestCPUSpan: a span counts the CPU this process spent while it ran
// (here, checksumming 64 MiB several times over) and a share of the cores
// in [0, 1] for the others; where the process's CPU time is not known
// (not Linux), the span says so instead of reporting zero.
func TestCPUSpan(t *testing.T) {
	lm := startLoad()
	buf := make([]byte, 64<<20)
	var sum uint32
	table := crc32.MakeTable(crc32.Castagnoli)
	for i := 0; i < 8; i++ {
		buf[i] = byte(sum)
		sum = crc32.Checksum(buf, table)
	}
	s := lm.span()
	if _, _, known := cpuTimes(); known != s.ok {
		t.Fatalf("span ok %v, CPU times readable %v", s.ok, known)
	}
	if s.ok && (s.self <= 0 || s.others < 0 || s.others > 1) {
		t.Fatalf("after 512 MiB checksummed: %+v (sum %x)", s, sum)
	}
	if got := shares([]float64{0, 0.123, 1}); got != "0% 12% 100%" {
		t.Fatalf("shares: %q", got)
	}
}
