//go:build !darwin

package metal

import (
	"fmt"
	"runtime"
)

// Open: Metal exists on macOS only.
func Open() (*Backend, error) {
	return nil, fmt.Errorf("%w (this is %s/%s): run with --backend cpu", ErrUnavailable, runtime.GOOS, runtime.GOARCH)
}
