//go:build !linux

package cuda

import (
	"fmt"
	"runtime"
)

// loadDriver: NVIDIA's driver API exists on Linux (and Windows, which
// tandem's GPU box does not run); elsewhere there is nothing to load.
func loadDriver() (*driver, error) {
	return nil, fmt.Errorf("%w (%s/%s): run the prefill worker with --backend cpu, or on Linux with an NVIDIA GPU", ErrUnsupported, runtime.GOOS, runtime.GOARCH)
}

func loadLt() (*lt, error) { return nil, ErrUnsupported }
