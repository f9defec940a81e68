package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/grammar"
)

// Request is one sequence submitted to the group's head (rank 0).
type Request struct {
	// ID names the sequence (the job id); unique among live sequences.
	ID string
	// Tokens are the tokens the group runs itself: the whole prompt for a
	// local prefill, or what follows the remotely prefilled part (usually
	// the prompt's last token). The last one is run as a decode step and
	// yields the first generated token; the others are prefilled.
	Tokens []int32
	// Remote, when set, says the first Remote.Tokens tokens were prefilled
	// elsewhere and their state arrives through kvtransfer.
	Remote *Remote
	// Sampling chooses how tokens are drawn (zero: greedy).
	Sampling sampling.Params
	// MaxTokens bounds the generated tokens (at least 1).
	MaxTokens int
	// Stop ends the sequence after any of these tokens (which is emitted).
	Stop []int32
	// Grammar, when set, constrains the tokens drawn: each step's mask
	// comes from it, and the sequence ends (ReasonStop) with the
	// <|end_of_msg|> that closes the reply. The last rank needs
	// Config.Vocabulary.
	Grammar *grammar.Spec
	// NoDraft turns speculative decoding off for this sequence (it is on
	// where the group drafts).
	NoDraft bool
	// Sink receives the tokens and the end. Required.
	Sink Sink
	// Images are the prompt's images in order (see Image).
	Images []Image
	// Encode, when set, computes the images' feature rows (runs the vision
	// tower): the head calls it once, off its loop, when the sequence is
	// admitted and some image the group prefills itself has no Rows (a
	// prefix-cache hit that covers every image needs none). Its result is
	// one row set per image, in order; an error ends the sequence with it.
	// Cancelling the sequence cancels its context.
	Encode func(ctx context.Context) ([][]float32, error)
}

// Image is one image of a prompt: its pad run, positions [At, At+Len) of
// the whole prompt (a remotely prefilled part included), the hash of its
// pixels, by which the prefix cache keys the run, and its feature rows
// [Len, hidden], which replace the run's embedded rows where the group
// prefills them (from Encode when nil).
type Image struct {
	At, Len int
	Hash    [32]byte
	Rows    []float32
}

// Remote describes a remotely prefilled state.
type Remote struct {
	// Tokens is the number of tokens the state holds.
	Tokens int
	// Sessions[r] authenticates rank r's share of the transfer.
	Sessions []Session
	// Deadline bounds the transfer: a state not committed on every rank by
	// then fails the sequence before it decodes.
	Deadline time.Time
	// Prompt, when set, are those Tokens tokens themselves. With it, and
	// the prefix cache on, the group keeps the state as a cache entry (when
	// Tokens lies on the cache's grid) and can take a base: see Append.
	Prompt []int32
	// Append proposes a base: the group's prefix cache may hold the MLA
	// rows of Prompt[:Append], so that the transfer carries only the rows
	// after them (and the KDA states). The head takes it if it holds those
	// rows (tokens compared) and every rank registers the transfer as an
	// append to them; otherwise the transfer carries the whole state.
	Append int
	// Appended, if set, receives the base the group took (0: none) before
	// Submit returns: the prefill worker is told to send accordingly.
	Appended *int
}

// Session is one rank's kvtransfer session.
type Session struct {
	ID     string
	Secret []byte
}

// Sink receives a sequence's tokens in order and then its end, exactly once.
// Calls come from the head's loop, one at a time: they must return quickly
// (queue the work; never wait on the group).
type Sink interface {
	Token(seq string, index int, token int32)
	End(seq string, r Result)
}

// Reason is why a sequence ended; the values are the control plane's
// finish reasons.
type Reason string

const (
	ReasonStop      Reason = "stop"      // a stop token
	ReasonLength    Reason = "length"    // MaxTokens reached
	ReasonCancelled Reason = "cancelled" // Cancel
	ReasonError     Reason = "error"     // see Result.Err
)

// Result is how a sequence ended.
type Result struct {
	Reason Reason
	Err    error // set when Reason is ReasonError
	Tokens int   // tokens generated (and delivered to the sink)
	// Cached is how many prompt tokens came from the group's prefix cache
	// (not prefilled again).
	Cached int
	// Steps is the decode steps that emitted its tokens; Drafted and
	// Accepted the tokens drafted for it and accepted (speculative
	// decoding: Tokens/Steps tokens per step).
	Steps, Drafted, Accepted int
	Timing                   Timing
}

// Timing marks a sequence's life on the head.
type Timing struct {
	Admitted   time.Time // every rank reserved it
	Ready      time.Time // every rank holds its state (remote: committed)
	FirstToken time.Time
	Ended      time.Time
	// PrefillCompute is the ranks' compute time for the prompt's prefill
	// steps, summed over the ranks (a step shared with other prompts
	// counts by its rows), and PrefillAttention the part of it in the MLA
	// attention (zero when not timed). The ranks overlap a prompt's
	// chunks, so the sums exceed the wall time from Ready to FirstToken;
	// their ratio is the attention's share of it.
	PrefillCompute, PrefillAttention time.Duration
	// PrefillSteps is how many prefill steps carried the prompt: its chunks
	// and the cuts at its prefix-cache snapshots.
	PrefillSteps int
}

// ErrRefused is wrapped by every refused admission.
var ErrRefused = errors.New("sequence refused")

// ErrNotReady is wrapped by a submission to a group whose ring is not formed.
var ErrNotReady = errors.New("decode group not ready")

// RefusedError names the rank that refused a sequence and why.
type RefusedError struct {
	Seq    string
	Rank   int
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("decode group: sequence %q refused by rank %d: %s", e.Seq, e.Rank, e.Reason)
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

// validate checks the request against the model and the group.
func (r *Request) validate(vocab, ranks, hidden int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("decode group: sequence %q: %s", r.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case r.ID == "" || len(r.ID) > 256:
		return bad("id must have 1..256 bytes")
	case len(r.Tokens) == 0:
		return bad("no tokens to run")
	case r.MaxTokens < 1:
		return bad("max tokens is %d, at least 1 needed", r.MaxTokens)
	case r.Sink == nil:
		return bad("no sink")
	}
	for i, id := range r.Tokens {
		if id < 0 || int(id) >= vocab {
			return bad("token %d is %d, outside the vocabulary [0, %d)", i, id, vocab)
		}
	}
	for i, id := range r.Stop {
		if id < 0 || int(id) >= vocab {
			return bad("stop token %d is %d, outside the vocabulary [0, %d)", i, id, vocab)
		}
	}
	if err := r.Sampling.Validate(); err != nil {
		return bad("%v", err)
	}
	if r.Grammar != nil {
		if err := r.Grammar.Validate(); err != nil {
			return bad("%v", err)
		}
	}
	if err := r.validateImages(hidden); err != nil {
		return bad("%v", err)
	}
	if rm := r.Remote; rm != nil {
		switch {
		case rm.Tokens < 0:
			return bad("remote state of %d tokens", rm.Tokens)
		case len(rm.Sessions) != ranks:
			return bad("%d transfer sessions for %d ranks", len(rm.Sessions), ranks)
		case rm.Deadline.IsZero() || time.Until(rm.Deadline) <= 0:
			return bad("the transfer deadline is unset or past")
		}
		switch {
		case rm.Prompt != nil && len(rm.Prompt) != rm.Tokens:
			return bad("remote prompt of %d tokens for a state of %d", len(rm.Prompt), rm.Tokens)
		case rm.Append < 0 || rm.Append > 0 && (rm.Prompt == nil || rm.Append >= rm.Tokens || rm.Append%prefixcache.Block != 0):
			return bad("append base of %d tokens for a remote state of %d (a multiple of %d below it, with the prompt)", rm.Append, rm.Tokens, prefixcache.Block)
		}
		for i, id := range rm.Prompt {
			if id < 0 || int(id) >= vocab {
				return bad("remote prompt token %d is %d, outside the vocabulary [0, %d)", i, id, vocab)
			}
		}
		for i, s := range rm.Sessions {
			if s.ID == "" || len(s.Secret) < 16 {
				return bad("rank %d's transfer session needs an id and a secret of 16 bytes at least", i)
			}
		}
	}
	return nil
}

// validateImages checks that the images' runs are in order, inside the
// prompt before its last token (which runs as a decode step from its own
// embedding), and that given rows fill their runs.
func (r *Request) validateImages(hidden int) error {
	prompt := len(r.Tokens)
	if r.Remote != nil {
		prompt += r.Remote.Tokens
	}
	end := 0
	for i, im := range r.Images {
		switch {
		case im.Len <= 0 || im.At < end:
			return fmt.Errorf("image %d: pad run [%d, %d) is empty or overlaps the previous image's", i, im.At, im.At+im.Len)
		case im.At+im.Len > prompt-1:
			return fmt.Errorf("image %d: pad run [%d, %d) reaches the prompt's last token (%d tokens): a prompt must end with text", i, im.At, im.At+im.Len, prompt)
		case im.Rows != nil && len(im.Rows) != im.Len*hidden:
			return fmt.Errorf("image %d: %d feature values for a run of %d rows of %d", i, len(im.Rows), im.Len, hidden)
		}
		end = im.At + im.Len
	}
	return nil
}
