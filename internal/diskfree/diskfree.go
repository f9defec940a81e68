// Package diskfree reports the free space of a filesystem, so that long
// writes (synthetic models of hundreds of GB) can be refused up front, and
// the disk space a file occupies, so that a sparse file can be told from a
// written one.
package diskfree

// Bytes returns the bytes available to this user on the filesystem holding
// path; ok is false where the platform cannot tell.
func Bytes(path string) (free int64, ok bool) { return bytesAvail(path) }

// Allocated returns the disk space a file's blocks take (what du reports),
// which for a sparse file is less than its size; ok is false where the
// platform cannot tell.
func Allocated(path string) (n int64, ok bool) { return allocated(path) }
