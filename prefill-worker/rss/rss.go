// Package rss reports the peak resident set size of this process, the
// figure a memory budget is checked against.
//
// On Linux it is VmHWM of /proc/self/status: the high-water mark of this
// program's own address space. getrusage's ru_maxrss would also count the
// parent's resident pages at the fork before exec (Go forks with a shared
// address space), which makes it useless for a child started by a large
// parent.
package rss

import "errors"

// ErrUnsupported is returned where the OS gives no peak RSS.
var ErrUnsupported = errors.New("rss: peak resident set size is not available on this OS")

// Peak is this process's peak resident set size in bytes.
func Peak() (int64, error) { return peakSelf() }
