// Package testkit is the helpers that tandem's tests share: a private home
// for each test binary (Main), prompt generation, polling a condition, a
// logger into the test's log and starting something the test closes. Only
// tests import it; it imports nothing of tandem's, so that any package's
// internal tests can use it.
package testkit

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// Prompt is a deterministic prompt of n token ids in [0, vocab): the same
// arguments give the same ids, and seeds that differ give prompts that
// differ from their first id on (unless vocab divides the difference times
// 7919).
func Prompt(n, vocab, seed int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((seed*7919 + i*104729 + 13) % vocab)
	}
	return out
}

// WaitFor waits until cond holds, checking it every few milliseconds; once
// ctx is done it fails the test, saying it was waiting for what. Bound ctx
// by the test's deadline (testctx.Context), not by a guess at the
// machine's speed.
func WaitFor(ctx context.Context, tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			tb.Fatalf("waiting for %s: %v", what, context.Cause(ctx))
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Logger is a logger into the test's log (info and above) with -v, and one
// that discards everything without.
func Logger(tb testing.TB) *zap.Logger {
	if testing.Verbose() {
		return zaptest.NewLogger(tb, zaptest.Level(zap.InfoLevel))
	}
	return zap.NewNop()
}

// Start calls start, fails the test if it returns an error, and closes what
// it started when the test ends.
func Start[T interface{ Close() error }](tb testing.TB, start func() (T, error)) T {
	tb.Helper()
	v, err := start()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = v.Close() })
	return v
}

// Get fetches url and returns its status and body, failing the test when
// the request cannot be made.
func Get(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
