package cli

import (
	"testing"

	"github.com/tandem-inference/tandem/internal/testkit"
)

// TestMain runs the tests in a home of their own: they start processes
// or read the user's config or cache directories.
func TestMain(m *testing.M) { testkit.Main(m) }
