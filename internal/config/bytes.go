package config

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

// BytesGrammar is the byte-size grammar, for help texts and errors.
const BytesGrammar = "a number with an optional unit: B (or none), " +
	"KiB MiB GiB TiB (powers of 1024) or KB MB GB TB (powers of 1000), in any case, " +
	"with a decimal fraction where the unit is larger than a byte: 512MiB, 1.5GiB, 64GB, 4096"

// units maps a lower-cased unit to its multiplier.
var units = map[string]int64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// ParseBytes reads a byte size in the grammar of BytesGrammar. The result
// is rounded down to a whole byte; a negative, fractional-byte or
// overflowing size is an error, and every error quotes the grammar.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult, ok := units[strings.ToLower(unit)]
	if !ok || num == "" || len(num) > 40 || strings.Count(num, ".") > 1 || strings.HasPrefix(num, ".") || strings.HasSuffix(num, ".") {
		return 0, fmt.Errorf("%q is not a byte size, which is %s", s, BytesGrammar)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("%q is not a byte size, which is %s", s, BytesGrammar)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if mult == 1 && !r.IsInt() {
		return 0, fmt.Errorf("byte size %q: a fraction of a byte (%s)", s, BytesGrammar)
	}
	n := new(big.Int).Quo(r.Num(), r.Denom()) // rounded down: both are positive
	if !n.IsInt64() {
		return 0, fmt.Errorf("byte size %q is too large (at most %d bytes)", s, int64(math.MaxInt64))
	}
	return n.Int64(), nil
}
