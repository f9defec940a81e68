package planner

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseBytes reads a byte count: a plain number of bytes, or a number with
// a binary (KiB, MiB, GiB, TiB; K, M, G, T) or decimal (KB, MB, GB, TB)
// unit, e.g. "512MiB", "1.5G", "4000000000".
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("byte size %q: want a number with an optional unit such as 512MiB or 4GiB", s)
	}
	mult := map[string]float64{
		"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	}[strings.ToLower(unit)]
	if mult == 0 {
		return 0, fmt.Errorf("byte size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", s, unit)
	}
	b := v * mult
	if b < 0 || b >= math.MaxInt64 || math.IsNaN(b) {
		return 0, fmt.Errorf("byte size %q is out of range", s)
	}
	return int64(b), nil
}
