package pipeline

import (
	"context"

	"github.com/tandem-inference/tandem/decode-worker/draft"
	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/kvtransfer"
)

// seq is a sequence on this rank. Every rank holds its entry (state and
// reservation); the last rank also its sampler and stop rules; the head its
// request, its place in the schedule and its sink.
type seq struct {
	id    string
	e     *rank.Entry
	admit *mesh.Admit
	in    *kvtransfer.Incoming // remote state not yet committed
	pend  *prefixcache.Pending // the cache entry it will leave, if any

	// Last rank.
	sampler   *sampling.Sampler
	stop      map[int32]bool
	generated int
	matcher   *grammar.Matcher // the grammar's, if the sequence has one
	mask      []uint64

	// Head.
	req       Request
	from      int        // prompt tokens restored from the prefix cache
	retried   bool       // admitted again without the cache after a rank missed its entry
	admitting bool       // the admission is going around the ring
	reply     chan error // answers Submit, once
	cancelled bool       // Cancel came during the admission
	failure   error      // a rank refused the state during the admission
	ready     []bool     // ranks whose state is in place (remote)
	nready    int
	slot      int                // its decode micro-batch, or -1
	encoding  context.CancelFunc // its images' Encode is running
	pending   []int32            // prompt tokens still to prefill
	next      int32              // the next decode step's input
	inflight  bool               // a decode step for it is in flight
	// Speculative decoding (speculate.go): its prompt and output so far
	// (nil when it does not draft), its drafts in flight, its k, and its
	// drafted and accepted tokens and decode steps.
	hist                     []int32
	draft                    []int32
	adapt                    *draft.Adaptive
	drafted, accepted, steps int
	emitted                  int
	timing                   Timing
}
