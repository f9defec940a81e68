package safetensors

import (
	"errors"
	"fmt"
)

// Error kinds; test for them with errors.Is. An *Error wraps one of them
// with the details.
var (
	ErrHeaderSize = errors.New("header length out of range")
	ErrSyntax     = errors.New("malformed header or index")
	ErrDType      = errors.New("unknown dtype")
	ErrShape      = errors.New("shape and byte length disagree")
	ErrOffsets    = errors.New("data offsets out of range")
	ErrOverlap    = errors.New("tensors overlap")
	ErrDuplicate  = errors.New("duplicate tensor")
	ErrMissing    = errors.New("missing tensor")
	ErrIndex      = errors.New("index does not match the shards")
	ErrFormat     = errors.New("inconsistent weight format")
	ErrClosed     = errors.New("checkpoint closed")
)

// Error reports a problem with one file of a checkpoint and, where it
// concerns one, the tensor.
type Error struct {
	File   string // path of the shard or index
	Tensor string // tensor name; empty when the problem is the file's
	Err    error  // wraps one of the Err* kinds
}

func (e *Error) Error() string {
	if e.Tensor == "" {
		return fmt.Sprintf("safetensors: %s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("safetensors: %s: tensor %q: %v", e.File, e.Tensor, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
