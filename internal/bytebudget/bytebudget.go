// Package bytebudget bounds the bytes of requests a process holds in
// memory at once. The coordinator holds submissions read from NATS and not
// yet answered to one; the OpenAI front door holds request bodies, from the
// first byte read until they are decoded, to the same one when both run in
// one process (`coordinator serve`), so that neither path can take the
// memory the other's bound was meant to protect.
package bytebudget

import "sync"

// Budget is a count of bytes held against a limit. It is safe for
// concurrent use; the zero value is not usable (New).
type Budget struct {
	limit int64

	mu   sync.Mutex
	held int64
}

// New returns a budget of limit bytes (limit > 0).
func New(limit int64) *Budget {
	if limit <= 0 {
		panic("bytebudget: limit must be positive")
	}
	return &Budget{limit: limit}
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Held is the bytes held now.
func (b *Budget) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// TryTake holds n more bytes if that keeps the total within the limit, and
// reports whether it did. A caller that got true must Release n.
func (b *Budget) TryTake(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n < 0 || b.held+n > b.limit {
		return false
	}
	b.held += n
	return true
}

// Take holds n more bytes whatever the total: for what a caller bounds
// otherwise (the coordinator's small submissions, bounded by their number).
// The bytes then count against everyone's TryTake. The caller must Release
// n.
func (b *Budget) Take(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
}

// Release gives back n bytes taken with TryTake or Take.
func (b *Budget) Release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	if b.held < 0 {
		panic("bytebudget: released more than was held")
	}
}
