package controlplane

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/internal/testkit"
)

// Every test shuts down what it starts: servers, connections, watchers,
// keep-alive goroutines and Serve loops.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testkit.Isolated(m))
}
