package report

import (
	"fmt"
	"math"
)

// Duration formats seconds for people: ms below a second, s below two
// minutes, min below two hours, h above.
func Duration(s float64) string {
	switch a := math.Abs(s); {
	case math.IsNaN(s):
		return "-"
	case a < 1:
		return fmt.Sprintf("%.0f ms", s*1e3)
	case a < 120:
		return fmt.Sprintf("%.1f s", s)
	case a < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	default:
		return fmt.Sprintf("%.1f h", s/3600)
	}
}

// Bytes formats a byte count in decimal units (GB = 1e9 bytes), as the
// hardware figures are quoted.
func Bytes(n int64) string {
	v := float64(n)
	for _, u := range []string{"B", "kB", "MB", "GB", "TB"} {
		if math.Abs(v) < 1000 || u == "TB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.1f %s", v, u)
		}
		v /= 1000
	}
	return ""
}

// Tokens formats a token count: 1k, 300k, 1M.
func Tokens(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
