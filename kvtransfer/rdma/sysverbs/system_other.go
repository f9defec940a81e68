//go:build !(linux || darwin)

package sysverbs

import (
	"fmt"
	"runtime"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// DefaultLibrary is the verbs library of this system: none.
func DefaultLibrary() string { return "" }

// System reports that this system has no verbs library.
func System() (verbs.Provider, error) { return Load("") }

// Load reports that this system has no verbs library.
func Load(path string) (verbs.Provider, error) {
	return nil, fmt.Errorf("%w: none is bound on %s", verbs.ErrNoLibrary, runtime.GOOS)
}
