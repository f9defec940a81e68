//go:build amd64 && !purego

package crc32c

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ

// foldAVX512 folds p (len a multiple of 256, at least 256) into 64 bytes
// whose CRC-32C, computed with initial value 0 and no inversions, equals
// that of p with init XORed into its first four bytes.
//
//go:noescape
func foldAVX512(init uint32, p *byte, n int, out *[64]byte)

func fold(init uint32, p []byte, out *[64]byte) { foldAVX512(init, &p[0], len(p), out) }
