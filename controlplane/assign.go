package controlplane

import (
	"fmt"
	"time"
)

// Role is the part a worker plays in a job.
type Role string

const (
	RolePrefill Role = "prefill" // prefill the prompt, ship each layer's state to its rank
	RoleDecode  Role = "decode"  // one rank of the decode group
)

// LayerPlacement is one decode rank's share of a job: the layers it holds,
// where to reach it, and the transfer session that carries its layers' state.
type LayerPlacement struct {
	Rank     int        `msgpack:"rank" json:"rank"`
	WorkerID string     `msgpack:"worker_id" json:"worker_id"`
	Layers   LayerRange `msgpack:"layers" json:"layers"`
	// TensorRank of TensorRanks: the rank's place in its pipeline stage,
	// whose ranks share its layers, each holding (and receiving) its
	// tensor rank's slice of their state (model.Config.ShardLayerState).
	// Zero: the rank holds its layers unsplit. Copied from its WorkerInfo.
	TensorRank  int    `msgpack:"tensor_rank,omitempty" json:"tensor_rank,omitempty"`
	TensorRanks int    `msgpack:"tensor_ranks,omitempty" json:"tensor_ranks,omitempty"`
	Transfer    string `msgpack:"transfer,omitempty" json:"transfer,omitempty"` // kvtransfer endpoint host:port
	Pipeline    string `msgpack:"pipeline,omitempty" json:"pipeline,omitempty"` // rank-to-rank endpoint host:port
	// SessionID and Secret authenticate the transfer of this rank's state.
	// Only the two sides of that transfer get the secret (see ForWorker).
	SessionID string `msgpack:"session_id,omitempty" json:"session_id,omitempty"`
	Secret    []byte `msgpack:"secret,omitempty" json:"secret,omitempty"`
}

// Assignment gives a worker its part of a job (request on WorkerAssign(worker
// id), answered by an AssignReply). A prefill worker gets the prompt minus
// its last token and every rank's placement with its session; a decode rank
// gets its own session only. For a remote job the decode ranks get the last
// prompt token and CachedTokens = len(prompt)-1; for a local one, the whole
// prompt and CachedTokens = 0.
type Assignment struct {
	JobID        string  `msgpack:"job_id" json:"job_id"`
	Role         Role    `msgpack:"role" json:"role"`
	WorkerID     string  `msgpack:"worker_id" json:"worker_id"` // the addressee, checked by the worker
	TokenIDs     []int32 `msgpack:"token_ids" json:"token_ids"`
	CachedTokens int     `msgpack:"cached_tokens,omitempty" json:"cached_tokens,omitempty"`
	// CachedTokenIDs, on a remote job's decode assignment, are the
	// prompt's first CachedTokens tokens (the remotely prefilled part),
	// sent when the coordinator uses the prefix caches: the group's head
	// compares them with the rows it holds for an append and keeps the
	// state as a cache entry.
	CachedTokenIDs []int32 `msgpack:"cached_token_ids,omitempty" json:"cached_token_ids,omitempty"`
	// AppendTokens, on a remote job: the decode group's prefix cache holds
	// the MLA rows of the prompt's first AppendTokens tokens, so the state
	// transfer carries only the rows after them (and the KDA states). On
	// the decode assignment it is proposed (the head takes it if it holds
	// them, and says so in its reply); on the prefill assignment it is
	// what the group took. A positive multiple of 64 below the remote
	// part's length, or 0.
	AppendTokens int `msgpack:"append_tokens,omitempty" json:"append_tokens,omitempty"`
	// Images are the job's images (the encoded files, as submitted), in
	// prompt order: the i-th run of <|media_pad|> ids in the prompt this
	// assignment shows (CachedTokenIDs then TokenIDs on a decode
	// assignment, TokenIDs on a prefill one) is Images[i]; the worker that
	// prefills a run replaces its rows' embeddings with that image's
	// features. Sent to the prefill worker, and to the decode group's
	// head when it sees the prompt (a local job, or cached_token_ids); the
	// coordinator never leaves pad ids in a remote job's decode part.
	Images   [][]byte `msgpack:"images,omitempty" json:"images,omitempty"`
	Sampling Sampling `msgpack:"sampling" json:"sampling"`
	// Placement lists the decode group's ranks in order: pipeline stages
	// of TensorRanks ranks each (tensor ranks 0..T-1 in order, on the same
	// layers), the stages' layer ranges tiling [0, layers) without gaps.
	Placement []LayerPlacement `msgpack:"placement" json:"placement"`
	GroupID   string           `msgpack:"group_id" json:"group_id"`
	// Client is the client that submitted the job: the decode group's
	// rank 0 publishes the tokens on ClientJobTokens(client, job id).
	Client string `msgpack:"client" json:"client"`
	// Encoding is the encoding of the client's submission (Encoding.Field:
	// "" msgpack, "json"): rank 0 publishes the tokens in it.
	Encoding string `msgpack:"encoding,omitempty" json:"encoding,omitempty"`
	// Deadline is when the worker gives up and reports the job failed;
	// zero means no deadline.
	Deadline time.Time `msgpack:"deadline,omitempty" json:"deadline,omitzero"`
}

// Validate checks the assignment, including that the placement tiles the
// layers and that this worker appears in it in the right role.
func (a *Assignment) Validate() error {
	const msg = "Assignment"
	if err := CheckID(a.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	if err := CheckID(a.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	if err := CheckID(a.GroupID); err != nil {
		return fieldErr(msg, "group_id", "%v", err)
	}
	if err := CheckID(a.Client); err != nil {
		return fieldErr(msg, "client", "%v", err)
	}
	if _, err := EncodingNamed(a.Encoding); err != nil {
		return fieldErr(msg, "encoding", "%v", err)
	}
	if a.Role != RolePrefill && a.Role != RoleDecode {
		return fieldErr(msg, "role", "is %q, must be prefill or decode", a.Role)
	}
	if len(a.TokenIDs) == 0 {
		return fieldErr(msg, "token_ids", "is empty")
	}
	if len(a.TokenIDs) > MaxPromptTokens {
		return fieldErr(msg, "token_ids", "has %d tokens, at most %d allowed", len(a.TokenIDs), MaxPromptTokens)
	}
	for i, id := range a.TokenIDs {
		if id < 0 {
			return fieldErr(msg, fmt.Sprintf("token_ids[%d]", i), "is %d, token ids are >= 0", id)
		}
	}
	if a.CachedTokens < 0 || a.CachedTokens > MaxPromptTokens {
		return fieldErr(msg, "cached_tokens", "is %d, want 0 to %d", a.CachedTokens, MaxPromptTokens)
	}
	if a.CachedTokenIDs != nil {
		if a.Role != RoleDecode || len(a.CachedTokenIDs) != a.CachedTokens {
			return fieldErr(msg, "cached_token_ids", "has %d tokens for %d cached ones in the %s role: a decode assignment's remote part", len(a.CachedTokenIDs), a.CachedTokens, a.Role)
		}
		for i, id := range a.CachedTokenIDs {
			if id < 0 {
				return fieldErr(msg, fmt.Sprintf("cached_token_ids[%d]", i), "is %d, token ids are >= 0", id)
			}
		}
	}
	if n := a.AppendTokens; n != 0 {
		remote := a.CachedTokens
		if a.Role == RolePrefill {
			remote = len(a.TokenIDs)
		}
		if n < 0 || n%64 != 0 || n >= remote || a.Role == RoleDecode && a.CachedTokenIDs == nil {
			return fieldErr(msg, "append_tokens", "is %d for a remote part of %d tokens: want a positive multiple of 64 below it (with cached_token_ids on a decode assignment)", n, remote)
		}
	}
	if err := a.Sampling.validate(msg + ".sampling"); err != nil {
		return err
	}
	if err := checkImages(msg, a.Images); err != nil {
		return err
	}
	if len(a.Placement) == 0 {
		return fieldErr(msg, "placement", "is empty: a job needs a decode group")
	}
	mine := false
	for i := range a.Placement {
		p := &a.Placement[i]
		field := fmt.Sprintf("placement[%d]", i)
		if p.Rank != i {
			return fieldErr(msg, field+".rank", "is %d, ranks are listed in order from 0", p.Rank)
		}
		if err := CheckID(p.WorkerID); err != nil {
			return fieldErr(msg, field+".worker_id", "%v", err)
		}
		if err := p.Layers.validate(msg, field+".layers"); err != nil {
			return err
		}
		if err := checkStage(msg, a.Placement, i); err != nil {
			return err
		}
		if err := checkAddr(msg, field+".transfer", p.Transfer); err != nil {
			return err
		}
		if err := checkAddr(msg, field+".pipeline", p.Pipeline); err != nil {
			return err
		}
		if err := checkOptionalID(msg, field+".session_id", p.SessionID); err != nil {
			return err
		}
		if len(p.Secret) != 0 && len(p.Secret) != SecretSize {
			return fieldErr(msg, field+".secret", "is %d bytes, want %d", len(p.Secret), SecretSize)
		}
		if a.Role == RolePrefill && (p.SessionID == "" || len(p.Secret) == 0 || p.Transfer == "") {
			return fieldErr(msg, field, "lacks transfer, session_id or secret, which the prefill worker needs for every rank")
		}
		if p.WorkerID == a.WorkerID {
			mine = true
		}
	}
	if T := max(a.Placement[0].TensorRanks, 1); len(a.Placement)%T != 0 {
		return fieldErr(msg, "placement", "has %d ranks, not whole stages of tensor_ranks %d: the last stage lacks tensor rank(s) %d..%d", len(a.Placement), T, len(a.Placement)%T, T-1)
	}
	if a.Role == RoleDecode && !mine {
		return fieldErr(msg, "placement", "does not include worker %q, the addressee", a.WorkerID)
	}
	return nil
}

// CheckStages checks that a group's ranks, listed in rank order, make
// pipeline stages of tensor ranks: one tensor size, each rank's tensor
// rank its rank mod that size, a stage's ranks on the same layers, and the
// stages tiling the layers from 0. A coordinator checks registered ranks
// with it before it places a job on them; msg names what is checked.
func CheckStages(msg string, ps []LayerPlacement) error {
	for i := range ps {
		if err := checkStage(msg, ps, i); err != nil {
			return err
		}
	}
	return nil
}

// checkStage checks placement entry i's place in the group: the same
// tensor size as entry 0, its tensor rank i mod T, the layers of its
// stage's first entry, and stages tiling the layers from 0.
func checkStage(msg string, ps []LayerPlacement, i int) error {
	p, field := &ps[i], fmt.Sprintf("placement[%d]", i)
	T := max(ps[0].TensorRanks, 1)
	if max(p.TensorRanks, 1) != T {
		return fieldErr(msg, field+".tensor_ranks", "is %d, rank 0's %d: every rank of a group has the same tensor size", p.TensorRanks, ps[0].TensorRanks)
	}
	if err := checkTensor(msg, field+".", p.Rank, p.TensorRank, p.TensorRanks); err != nil {
		return err
	}
	if i%T > 0 {
		if first := ps[i-i%T]; p.Layers != first.Layers {
			return fieldErr(msg, field+".layers", "is %v, but its stage's tensor rank 0 (rank %d) holds %v: a stage's tensor ranks share its layers", p.Layers, i-i%T, first.Layers)
		}
		return nil
	}
	if i == 0 && p.Layers.First != 0 {
		return fieldErr(msg, field+".layers", "is %v, the first rank starts at layer 0", p.Layers)
	}
	if i > 0 && p.Layers.First != ps[i-1].Layers.End {
		return fieldErr(msg, field+".layers", "is %v but rank %d ends at %d: stages must tile the layers", p.Layers, i-1, ps[i-1].Layers.End)
	}
	return nil
}

// ForWorker returns a copy of a addressed to the decode rank workerID, with
// every other rank's transfer secret removed: a secret goes only to the two
// sides of its transfer (the prefill worker gets a itself).
func (a *Assignment) ForWorker(workerID string) Assignment {
	b := *a
	b.Role, b.WorkerID = RoleDecode, workerID
	b.Placement = make([]LayerPlacement, len(a.Placement))
	for i, p := range a.Placement {
		if p.WorkerID != workerID {
			p.Secret = nil
		} else {
			p.Secret = append([]byte(nil), p.Secret...)
		}
		b.Placement[i] = p
	}
	return b
}

// AssignReply answers an Assignment: accepted (memory reserved), or refused
// with a reason.
type AssignReply struct {
	JobID         string `msgpack:"job_id" json:"job_id"`
	WorkerID      string `msgpack:"worker_id" json:"worker_id"`
	Accepted      bool   `msgpack:"accepted" json:"accepted"`
	ReservedBytes uint64 `msgpack:"reserved_bytes,omitempty" json:"reserved_bytes,omitempty"`
	// Resumed: the worker already holds the job (or ended it recently)
	// from an earlier assignment under the same job id; nothing new was
	// started, and Progress is the job's latest report there (its final
	// one when it ended). A job id is admitted once per worker.
	Resumed bool `msgpack:"resumed,omitempty" json:"resumed,omitempty"`
	// AppendTokens is the base the decode group took for a remote job's
	// transfer (the assignment's proposal, or 0: the whole state).
	AppendTokens int       `msgpack:"append_tokens,omitempty" json:"append_tokens,omitempty"`
	Progress     *Progress `msgpack:"progress,omitempty" json:"progress,omitempty"`
	Error        string    `msgpack:"error,omitempty" json:"error,omitempty"`
	Code         ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks that a refusal says why.
func (r *AssignReply) Validate() error {
	const msg = "AssignReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	if r.Accepted == (r.Error != "") {
		return fieldErr(msg, "error", "accepted is %v with error %q: a refusal, and only it, says why", r.Accepted, r.Error)
	}
	if r.Error != "" && r.JobID == "" && r.WorkerID == "" {
		return nil // the refusal of a request too malformed to name its job
	}
	if err := CheckID(r.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	if err := CheckID(r.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	if r.Resumed && !r.Accepted {
		return fieldErr(msg, "resumed", "is true on a refusal")
	}
	if r.Progress != nil {
		if err := r.Progress.Validate(); err != nil {
			return fmt.Errorf("%s.progress: %w", msg, err)
		}
	}
	return nil
}

// Err returns the refusal as a *RemoteError, or nil when accepted.
func (r *AssignReply) Err() error { return replyErr(r.Error, r.Code) }

// Progress is a worker's report on a job, published on
// WorkerProgress(worker, job id) for the coordinator: layers done, bytes shipped, tokens made, a failure,
// and the figures it measured (for the cost model).
type Progress struct {
	JobID    string    `msgpack:"job_id" json:"job_id"`
	WorkerID string    `msgpack:"worker_id" json:"worker_id"`
	Stage    JobState  `msgpack:"stage" json:"stage"` // prefilling, transferring, decoding, or a final state
	Time     time.Time `msgpack:"time" json:"time"`
	// Layers: prefill or transfer progress; nil when not layer-bound.
	Layers *LayerProgress `msgpack:"layers,omitempty" json:"layers,omitempty"`
	Tokens int            `msgpack:"tokens,omitempty" json:"tokens,omitempty"` // prompt tokens processed or tokens generated
	Bytes  uint64         `msgpack:"bytes,omitempty" json:"bytes,omitempty"`   // state bytes sent or received
	// Cached: prompt tokens the worker took from its prefix cache instead
	// of prefilling them (the decode group's final report; the prefill
	// worker's, from its prefix store).
	Cached int `msgpack:"cached_tokens,omitempty" json:"cached_tokens,omitempty"`
	// Elapsed is the stage's duration so far (final for a final stage).
	Elapsed  time.Duration `msgpack:"elapsed_ns,omitempty" json:"elapsed_ns,omitempty"`
	Measured *Rates        `msgpack:"measured,omitempty" json:"measured,omitempty"`
	Error    *JobError     `msgpack:"error,omitempty" json:"error,omitempty"` // stage failed
	// Output: the decode group's final report carries everything the job
	// generated.
	Output *Output `msgpack:"output,omitempty" json:"output,omitempty"`
	// Speculation: the decode group's final report's account of its
	// speculative decoding.
	Speculation *Speculation `msgpack:"speculation,omitempty" json:"speculation,omitempty"`
}

// Speculation is how a job's tokens were decoded: in Steps decode steps,
// of which some verified drafted tokens: Drafted were drafted and Accepted
// of them accepted (each emitted without a step of its own).
type Speculation struct {
	Steps    int `msgpack:"steps" json:"steps"`
	Drafted  int `msgpack:"drafted,omitempty" json:"drafted,omitempty"`
	Accepted int `msgpack:"accepted,omitempty" json:"accepted,omitempty"`
}

func (s *Speculation) validate(msg, field string) error {
	if s.Steps < 0 || s.Drafted < 0 || s.Accepted < 0 || s.Accepted > s.Drafted {
		return fieldErr(msg, field, "is %d steps, %d drafted, %d accepted: want counts >= 0 and accepted <= drafted", s.Steps, s.Drafted, s.Accepted)
	}
	return nil
}

// Validate checks the report and that a failure says why.
func (p *Progress) Validate() error {
	const msg = "Progress"
	if err := CheckID(p.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	if err := CheckID(p.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	switch p.Stage {
	case StatePrefilling, StateTransferring, StateDecoding, StateDone, StateFailed, StateCancelled:
	default:
		return fieldErr(msg, "stage", "is %q, want prefilling, transferring, decoding, done, failed or cancelled", p.Stage)
	}
	switch {
	case p.Time.IsZero():
		return fieldErr(msg, "time", "is missing")
	case p.Tokens < 0:
		return fieldErr(msg, "tokens", "is %d, must be >= 0", p.Tokens)
	case p.Cached < 0:
		return fieldErr(msg, "cached_tokens", "is %d, must be >= 0", p.Cached)
	case p.Elapsed < 0:
		return fieldErr(msg, "elapsed_ns", "is %d, must be >= 0", p.Elapsed)
	case p.Stage == StateFailed && p.Error == nil:
		return fieldErr(msg, "error", "is missing from a failed report")
	}
	if p.Layers != nil {
		if err := p.Layers.validate(msg, "layers"); err != nil {
			return err
		}
	}
	if p.Measured != nil {
		if err := p.Measured.validate(msg, "measured"); err != nil {
			return err
		}
	}
	if p.Speculation != nil {
		if err := p.Speculation.validate(msg, "speculation"); err != nil {
			return err
		}
	}
	if p.Output != nil {
		if !p.Stage.Final() {
			return fieldErr(msg, "output", "is set on a %s report: only a final report carries the output", p.Stage)
		}
		if err := p.Output.validate(msg, "output"); err != nil {
			return err
		}
	}
	if p.Error != nil {
		return p.Error.validate(msg, "error")
	}
	return nil
}
