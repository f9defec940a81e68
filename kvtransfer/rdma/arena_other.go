//go:build !unix

package rdma

import "github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"

func mapArena(n int) ([]byte, error) { return nil, verbs.ErrNoLibrary }

func unmapArena(b []byte) error { return nil }
