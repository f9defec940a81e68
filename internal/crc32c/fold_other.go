//go:build !amd64 || purego

package crc32c

// On other CPUs hash/crc32 is the fast path (arm64 has CRC32C instructions).
const haveFold = false

func fold(init uint32, p []byte, out *[64]byte) { panic("crc32c: no folding on this CPU") }
