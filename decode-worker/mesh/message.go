// Package mesh is the rank-to-rank exchange of a decode group: a ring of
// authenticated kvtransfer channels, rank r to rank r+1 and the last rank back
// to rank 0, that carries each step's activations (the hidden state and the
// AttnRes block stack of every token), the sampled tokens, and the small
// control messages that admit, start and release sequences.
//
// The ring moves messages and reports its links going up and down; what the
// messages mean is the pipeline's business. Messages larger than one frame
// are split over several and joined again, so a long prefill chunk's
// activations fit any transport frame limit.
package mesh

import "github.com/tandem-inference/tandem/grammar"

// Kind is what a message is.
type Kind uint8

const (
	KindPing    Kind = iota + 1 // keep-alive; never delivered
	KindForm                    // rank 0 forms the ring at Epoch; it comes back when every link is up
	KindAdmit                   // reserve a sequence on every rank (goes around, collecting verdicts)
	KindRelease                 // free a sequence on every rank
	KindReady                   // a rank's remote state for Seq committed and verified
	KindFailed                  // a sequence failed on a rank (Reason says why)
	KindStep                    // a micro-batch's activations, to the next rank
	KindTokens                  // the last rank's sampled tokens for a step, back to rank 0
	KindReset                   // a rank lost a link (Reason): drop everything; passed on in the direction it travels

	kindCont // continuation frame of a split message

	// KindCancel: the head is cancelling Seq. Each rank's reader acts on it
	// as it arrives (Config.Early), before the messages queued ahead of it,
	// and passes it on; the Release follows in order.
	KindCancel

	// kindBye: the sender is leaving and has written everything it had;
	// the receiver takes the link down and closes its end first, so that
	// the leaver's close loses nothing in flight (see link.leave). Never
	// delivered.
	kindBye
)

func (k Kind) String() string {
	switch k {
	case KindPing:
		return "ping"
	case KindForm:
		return "form"
	case KindAdmit:
		return "admit"
	case KindRelease:
		return "release"
	case KindReady:
		return "ready"
	case KindFailed:
		return "failed"
	case KindStep:
		return "step"
	case KindTokens:
		return "tokens"
	case KindReset:
		return "reset"
	case kindCont:
		return "cont"
	case KindCancel:
		return "cancel"
	case kindBye:
		return "bye"
	}
	return "kind?"
}

// Header is a message's msgpack header; its payload travels as raw bytes.
type Header struct {
	Kind   Kind   `msgpack:"k"`
	Epoch  uint64 `msgpack:"e,omitempty"`
	Rank   int    `msgpack:"r,omitempty"` // the rank a Ready, Failed or Reset comes from
	Seq    string `msgpack:"s,omitempty"`
	Reason string `msgpack:"why,omitempty"`
	// Keep, on a Release, says the sequence ended well: each rank keeps its
	// planned prefix-cache entry (on failures they are dropped, since the
	// ranks may have stepped it unevenly).
	Keep bool `msgpack:"keep,omitempty"`
	// Wait, on a Form, says a rank is not ready for the epoch yet (its
	// tensor stage's links are connecting): the head sends it again.
	Wait bool `msgpack:"wait,omitempty"`

	Admit  *Admit  `msgpack:"a,omitempty"`
	Step   *Step   `msgpack:"st,omitempty"`
	Tokens *Tokens `msgpack:"tk,omitempty"`

	// Size is the whole payload's length when it is split over frames.
	Size int64 `msgpack:"n,omitempty"`
}

// Admit asks every rank to reserve a sequence. Each rank that refuses
// appends a Verdict; the ranks after a refusal reserve nothing.
type Admit struct {
	Tokens    int `msgpack:"tokens"`           // prompt tokens the group runs itself
	Cached    int `msgpack:"cached,omitempty"` // tokens already in a remote state
	MaxTokens int `msgpack:"max"`
	// Remote says the state comes from kvtransfer; Sessions[r] is rank r's.
	Remote      bool      `msgpack:"remote,omitempty"`
	Sessions    []Session `msgpack:"sessions,omitempty"`
	Deadline    int64     `msgpack:"deadline,omitempty"` // unix ns
	LatentDType uint8     `msgpack:"latent,omitempty"`
	Sampling    Sampling  `msgpack:"sampling"`
	Stop        []int32   `msgpack:"stop,omitempty"`
	// Grammar, when set, constrains the tokens the last rank draws.
	Grammar  *grammar.Spec `msgpack:"grammar,omitempty"`
	Verdicts []Verdict     `msgpack:"verdicts,omitempty"`
	// Prefix is the head's prefix-cache decision for the sequence.
	Prefix *Prefix `msgpack:"prefix,omitempty"`
	// Evicted lists the cache entries ranks dropped for room while this
	// admission went around; the ranks after them and the head drop them
	// too.
	Evicted []uint64 `msgpack:"evicted,omitempty"`
}

// Prefix is the head's prefix-cache decision for one sequence: resume from
// entry Hit at token At (its first At tokens are not run), and keep the
// state at the Snaps positions as entry Keep when the sequence ends. For a
// remote sequence, Hit and At are the base its transfer appends to: the
// ranks take the MLA rows of entry Hit's first At tokens, whose prefix-key
// link is Link, and receive the rest.
type Prefix struct {
	Hit   uint64 `msgpack:"hit,omitempty"`
	At    int    `msgpack:"at,omitempty"`
	Link  uint64 `msgpack:"link,omitempty"`
	Keep  uint64 `msgpack:"keep,omitempty"`
	Snaps []int  `msgpack:"snaps,omitempty"`
}

// Session authenticates one rank's share of a remote state transfer.
type Session struct {
	ID     string `msgpack:"id"`
	Secret []byte `msgpack:"secret"`
}

// Sampling mirrors sampling.Params on the wire.
type Sampling struct {
	Temperature float64 `msgpack:"t,omitempty"`
	TopK        int     `msgpack:"k,omitempty"`
	TopP        float64 `msgpack:"p,omitempty"`
	Seed        uint64  `msgpack:"s,omitempty"`
}

// Verdict is one rank's refusal of an admission.
type Verdict struct {
	Rank   int    `msgpack:"r"`
	Reason string `msgpack:"why"`
	// Miss says the rank lacked the cache entry the head chose: the head
	// admits the sequence again without it.
	Miss bool `msgpack:"miss,omitempty"`
}

// Step is one micro-batch's pass through the pipeline. The payload holds the
// AttnRes partial sum and then each completed block of the stack, each
// [sum(Rows), Cols] float32 little-endian.
type Step struct {
	ID    uint64   `msgpack:"id"`
	Phase uint8    `msgpack:"phase"`
	Seqs  []string `msgpack:"seqs"`
	Pos   []int32  `msgpack:"pos"`  // tokens each sequence had before this step
	Rows  []int32  `msgpack:"rows"` // each sequence's rows
	Cols  int      `msgpack:"cols"`
	Stack int      `msgpack:"stack"` // completed blocks after the partial sum
	// Draft, in a decode step, holds the drafted tokens of every sequence
	// back to back: sequence i's last token is followed by Rows[i]-1 drafts,
	// which the last rank verifies (speculative decoding).
	Draft []int32 `msgpack:"draft,omitempty"`
	Trace
}

// Tokens carries the last rank's results for a step back to rank 0 (an
// empty Results acknowledges a prefill step).
type Tokens struct {
	Step    uint64   `msgpack:"step"`
	Results []Result `msgpack:"results,omitempty"`
	Trace
}

// Result is one sequence's sampled token, and its end when Done. After a
// verify step, Accepted holds the drafted tokens the last rank accepted,
// which come before Token: the step emits Accepted then Token.
type Result struct {
	Seq      string  `msgpack:"s"`
	Token    int32   `msgpack:"t"`
	Accepted []int32 `msgpack:"acc,omitempty"`
	Done     bool    `msgpack:"d,omitempty"`
	Reason   string  `msgpack:"why,omitempty"` // "stop", "length" or "error"
	Err      string  `msgpack:"err,omitempty"`
}

// Trace accumulates a step's timing as it goes around the ring: each rank's
// compute time, and each hop's mesh time (encode, transit and decode).
type Trace struct {
	Compute []int64 `msgpack:"compute,omitempty"` // ns, by rank
	Mesh    []int64 `msgpack:"mesh,omitempty"`    // ns, by sending rank
	// Coll is the part of Compute a tensor-parallel stage spent in its
	// reductions, ns by the stage's sending rank.
	Coll   []int64 `msgpack:"coll,omitempty"`
	SentAt int64   `msgpack:"sent,omitempty"` // unix ns the sender handed it to its link
	// Attn is a prefill step's time in the MLA attention, ns by sequence,
	// summed over the ranks it went through.
	Attn map[string]int64 `msgpack:"attn,omitempty"`
}
