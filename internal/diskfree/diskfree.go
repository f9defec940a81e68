// Package diskfree reports the free space of a filesystem, so that long
// writes (synthetic models of hundreds of GB) can be refused up front.
package diskfree

// Bytes returns the bytes available to this user on the filesystem holding
// path; ok is false where the platform cannot tell.
func Bytes(path string) (free int64, ok bool) { return bytesAvail(path) }
