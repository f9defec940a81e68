//go:build !amd64 || purego

package crc32c

import "hash/crc32"

// Elsewhere hash/crc32 is the fast path (arm64 has CRC32C instructions).
const (
	haveFold = false
	foldMin  = 0
)

func update(crc uint32, p []byte) uint32 { return crc32.Update(crc, table, p) }
