// Package prefixcache is a decode rank's prefix-state cache: the states of
// prompts the group has prefilled, kept after their sequences end so that a
// later prompt that starts with the same tokens (the next turn of an agent
// session, another session with the same system prompt) prefills only the
// rest.
//
// K3's state is hybrid. The MLA layers' latent rows are per token, so any
// prefix of them is reusable; the KDA layers' recurrent state cannot be cut
// back, so it is kept as snapshots at chosen positions. A prefix is
// reusable up to the last snapshot within the matched tokens. Snapshots are
// taken only at multiples of model.KDAChunk of prefilled (chunked-form)
// tokens: there a resumed prefill is bit-identical to a from-scratch one,
// while states that went through decode steps (generated text) are not
// (TestSnapshotForms), so a continuation from the cache gives exactly the
// from-scratch result.
//
// Entries are found by a hash chain over blocks of Block tokens, seeded by
// the model's identity and the cache dtype, and the tokens are compared on
// every hit: a hash only narrows the search.
//
// The group's head decides (lookups, the positions to snapshot, the entry
// ids) and carries its decisions to the other ranks in the admission; each
// rank holds its own layers' share of every entry, accounted in its memory
// budget. The decisions are pure functions here, tested without a group.
package prefixcache

import (
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/model"
)

// Block is the token block the hash chain covers and the grid snapshots lie
// on: the KDA chunk, where resumed prefills are exact.
const Block = model.KDAChunk

// The chain is internal/prefixkey's, which the coordinator computes too.
type (
	Hash     = prefixkey.Hash
	HashFunc = prefixkey.HashFunc
)

// SHA256 is the default chain function.
var SHA256 = prefixkey.SHA256

// Chain returns the links of tokens' full blocks.
func Chain(f HashFunc, salt Hash, tokens []int32) []Hash { return prefixkey.Chain(f, salt, tokens) }

// Salt seeds a chain with the model's identity and the cache dtype.
func Salt(modelID string, dtype model.DType) Hash { return prefixkey.Salt(modelID, uint8(dtype)) }

// Snapshots plans the positions at which a sequence's state is kept
// (prefixkey.Snapshots: the coordinator prices the prefill steps that end
// there).
func Snapshots(from, end, stride int) []int { return prefixkey.Snapshots(from, end, stride) }

// NextStop is the first planned position after pos, or 0 when none is
// left: a prefill step of the sequence ends there so that its state can be
// kept.
func NextStop(plan []int, pos int) int {
	for _, p := range plan {
		if p > pos {
			return p
		}
	}
	return 0
}
