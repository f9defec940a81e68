//go:build !(linux || darwin)

package safetensors

import (
	"errors"
	"os"
)

// canMap is false here: Bytes reads each tensor into memory instead.
const canMap = false

func mapFile(*os.File, int64) ([]byte, error) { return nil, errors.ErrUnsupported }

func unmapFile([]byte) error { return nil }

// lockPages is never called here: tensors are read into the heap.
func lockPages([]byte) error { return errors.ErrUnsupported }
