package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestMatchesHashCRC32 checks every length up to a few folding steps past
// the threshold, at every alignment of a few, with random initial values,
// and large inputs, against hash/crc32.
func TestMatchesHashCRC32(t *testing.T) {
	if !haveFold {
		t.Log("no AVX-512 VPCLMULQDQ here: checking the hash/crc32 path only")
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	check := func(crc uint32, p []byte) {
		t.Helper()
		if got, want := Update(crc, p), crc32.Update(crc, table, p); got != want {
			t.Fatalf("Update(%#x, %d bytes at offset %d) = %#x, want %#x", crc, len(p), cap(buf)-cap(p), got, want)
		}
	}
	for n := 0; n <= foldMin+3*256+1; n++ {
		check(r.Uint32(), buf[n%7:][:n])
	}
	for _, n := range []int{4096, 65536, 65536 + 255, 1 << 20} {
		for off := range 3 {
			check(0, buf[off:][:n])
			check(r.Uint32(), buf[off:][:n])
		}
	}
	// Chained updates equal one over the whole.
	whole := Checksum(buf[:300000])
	if got := Update(Checksum(buf[:123457]), buf[123457:300000]); got != whole {
		t.Fatalf("chained %#x, whole %#x", got, whole)
	}
}

// TestDetectsBitFlips: a single flipped bit anywhere in a folded input
// changes the checksum (CRC-32C detects every 1-bit error).
func TestDetectsBitFlips(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := make([]byte, 8192)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	want := Checksum(p)
	for bit := 0; bit < len(p)*8; bit += 61 {
		p[bit/8] ^= 1 << (bit % 8)
		if Checksum(p) == want {
			t.Fatalf("bit %d flipped: checksum unchanged", bit)
		}
		p[bit/8] ^= 1 << (bit % 8)
	}
}

func benchmarkUpdate(b *testing.B, n int, f func(uint32, []byte) uint32) {
	p := make([]byte, n)
	b.SetBytes(int64(n))
	for b.Loop() {
		f(0, p)
	}
}

func BenchmarkUpdate1MiB(b *testing.B) { benchmarkUpdate(b, 1<<20, Update) }

// BenchmarkHashCRC32_1MiB is the limit to compare with: hash/crc32 on the
// same input.
func BenchmarkHashCRC32_1MiB(b *testing.B) {
	benchmarkUpdate(b, 1<<20, func(c uint32, p []byte) uint32 { return crc32.Update(c, table, p) })
}

func BenchmarkUpdate64KiB(b *testing.B) { benchmarkUpdate(b, 64<<10, Update) }
func BenchmarkHashCRC32_64KiB(b *testing.B) {
	benchmarkUpdate(b, 64<<10, func(c uint32, p []byte) uint32 { return crc32.Update(c, table, p) })
}
