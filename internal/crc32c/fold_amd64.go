//go:build amd64 && !purego

package crc32c

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ

// foldMin is the shortest input folded: below it the fixed cost of the
// reduction outweighs the gain.
const foldMin = 1024

func update(crc uint32, p []byte) uint32 {
	if len(p) < foldMin || !haveFold {
		return crc32.Update(crc, table, p)
	}
	// The folded 64 bytes have, as a message on their own, the residue of
	// p[:n] with the initial value folded in: their CRC with no pre- and
	// post-inversion, then the tail.
	n := len(p) &^ 255
	var folded [64]byte
	foldAVX512(^crc, &p[0], n, &folded)
	return crc32.Update(crc32.Update(0xFFFFFFFF, table, folded[:]), table, p[n:])
}

// foldAVX512 folds p[:n] (n a multiple of 256, at least 256) into 64 bytes
// whose CRC-32C, computed with initial value 0 and no inversions, equals
// that of p[:n] with init XORed into its first four bytes.
//
//go:noescape
func foldAVX512(init uint32, p *byte, n int, out *[64]byte)
