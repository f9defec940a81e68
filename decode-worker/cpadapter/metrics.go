package cpadapter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/health"
	"github.com/tandem-inference/tandem/kvtransfer"
)

const ns = "tandem_decode"

// Metrics are a decode rank's Prometheus metrics: what its pipeline and
// kvtransfer server count (read at each scrape: state memory, sequences,
// steps and their time, received state bytes, transfer errors) and, on
// rank 0, the time between a job's tokens and the assignments it took or
// refused. A nil *Metrics records nothing.
type Metrics struct {
	reg         *prometheus.Registry
	interToken  prometheus.Histogram
	assignments *health.Assignments
}

// NewMetrics makes the metrics on reg; call Watch once the rank's pipeline
// and kvtransfer server exist.
func NewMetrics(reg *prometheus.Registry) *Metrics {
	m := &Metrics{reg: reg,
		interToken: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "inter_token_seconds",
			Help:    "Rank 0: time between two consecutive tokens of a job, as they are published.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}),
		assignments: health.NewAssignments(reg, ns,
			"Rank 0: assignments answered, by outcome: accepted, resumed (a job held or ended here) or refused."),
	}
	reg.MustRegister(m.interToken)
	return m
}

// Watch exports the pipeline's and the kvtransfer server's counters, read
// at each scrape.
func (m *Metrics) Watch(w *pipeline.Worker, srv *kvtransfer.Server) {
	if m != nil {
		m.reg.MustRegister(health.Collector{Descs: descs, Read: func(s health.Sink) { collect(s, w, srv) }})
	}
}

func (m *Metrics) assignment(outcome string) {
	if m != nil {
		m.assignments.Count(outcome)
	}
}

func (m *Metrics) gap(d time.Duration) {
	if m != nil {
		m.interToken.Observe(d.Seconds())
	}
}

var (
	descFormed    = prometheus.NewDesc(ns+"_ring_formed", "1 when the group's ring is formed (every mesh link up), else 0.", nil, nil)
	descSeqs      = prometheus.NewDesc(ns+"_sequences", "Sequences this rank holds (admitted and not yet freed).", nil, nil)
	descReserved  = prometheus.NewDesc(ns+"_state_reserved_bytes", "State memory reserved for the sequences held (KV and KDA state of this rank's layers).", nil, nil)
	descBudget    = prometheus.NewDesc(ns+"_memory_budget_bytes", "The rank's memory budget for state (0: unlimited).", nil, nil)
	descCache     = prometheus.NewDesc(ns+"_prefix_cache_bytes", "Bytes of the budget the prefix cache holds.", nil, nil)
	descSteps     = prometheus.NewDesc(ns+"_steps_total", "Pipeline steps this rank computed (prefill chunks and decode steps).", nil, nil)
	descCompute   = prometheus.NewDesc(ns+"_compute_seconds_total", "Time spent in this rank's layers (and sampling, on the last rank).", nil, nil)
	descSeqTotal  = prometheus.NewDesc(ns+"_sequences_total", "Rank 0: sequences by outcome: admitted, refused, finished, failed.", []string{"outcome"}, nil)
	descTokens    = prometheus.NewDesc(ns+"_tokens_total", "Rank 0: tokens delivered.", nil, nil)
	descQueued    = prometheus.NewDesc(ns+"_queued_sequences", "Rank 0: sequences waiting for a step.", nil, nil)
	descDSteps    = prometheus.NewDesc(ns+"_decode_steps_total", "Rank 0: decode steps that came back around the ring.", nil, nil)
	descStepTime  = prometheus.NewDesc(ns+"_decode_step_seconds_total", "Rank 0: decode steps' time, by part: round_trip, compute (every rank's) and mesh (every hop's).", []string{"part"}, nil)
	descRecvBytes = prometheus.NewDesc(ns+"_transfer_received_bytes_total", "State bytes received over kvtransfer and verified (remote prefills' states for this rank's layers).", nil, nil)
	descSessions  = prometheus.NewDesc(ns+"_transfer_sessions_total", "kvtransfer sessions by outcome: committed or failed.", []string{"outcome"}, nil)
	descTErrors   = prometheus.NewDesc(ns+"_transfer_errors_total", "kvtransfer errors by kind: auth (refused proofs), protocol, checksum, connection.", []string{"kind"}, nil)
	descTHeld     = prometheus.NewDesc(ns+"_transfer_held_bytes", "State buffers kvtransfer allocated and has not yet handed over or freed.", nil, nil)
	descDrafted   = prometheus.NewDesc(ns+"_draft_drafted_tokens_total", "Rank 0: tokens drafted for speculative decoding (verified by the group).", nil, nil)
	descAccepted  = prometheus.NewDesc(ns+"_draft_accepted_tokens_total", "Rank 0: drafted tokens the verification accepted (each emitted without a step of its own).", nil, nil)
	descRejected  = prometheus.NewDesc(ns+"_draft_rejected_tokens_total", "Rank 0: drafted tokens the verification rejected (their rows were computed for nothing).", nil, nil)
	descAccLen    = prometheus.NewDesc(ns+"_draft_accepted_length", "Rank 0: drafted tokens accepted per verification (a sequence's step that carried drafts).", nil, nil)
)

var descs = []*prometheus.Desc{descFormed, descSeqs, descReserved, descBudget, descCache, descSteps, descCompute, descSeqTotal,
	descTokens, descQueued, descDSteps, descStepTime, descRecvBytes, descSessions, descTErrors, descTHeld,
	descDrafted, descAccepted, descRejected, descAccLen}

// collect reads the pipeline's and the kvtransfer server's counters.
func collect(s health.Sink, w *pipeline.Worker, srv *kvtransfer.Server) {
	st := w.Stats()
	gauge, counter := s.Gauge, s.Counter
	formed := 0.0
	if st.Formed {
		formed = 1
	}
	gauge(descFormed, formed)
	gauge(descSeqs, float64(st.Sequences))
	gauge(descReserved, float64(st.ReservedBytes))
	gauge(descBudget, float64(st.BudgetBytes))
	gauge(descCache, float64(st.Cache.Bytes))
	counter(descSteps, float64(st.Steps))
	counter(descCompute, st.ComputeTime.Seconds())
	for outcome, v := range map[string]int64{"admitted": st.Admitted, "refused": st.Refused, "finished": st.Finished, "failed": st.Failed} {
		counter(descSeqTotal, float64(v), outcome)
	}
	counter(descTokens, float64(st.Tokens))
	gauge(descQueued, float64(st.Queued))
	counter(descDSteps, float64(st.DecodeSteps))
	for part, d := range map[string]time.Duration{"round_trip": st.StepTime, "compute": st.StepComputeTime, "mesh": st.StepMeshTime} {
		counter(descStepTime, d.Seconds(), part)
	}
	counter(descDrafted, float64(st.DraftedTokens))
	counter(descAccepted, float64(st.AcceptedTokens))
	counter(descRejected, float64(st.DraftedTokens-st.AcceptedTokens))
	count, sum, buckets := acceptedHistogram(st.AcceptedRuns)
	s.Histogram(descAccLen, count, sum, buckets)
	ts := srv.Stats()
	counter(descRecvBytes, float64(ts.BytesVerified))
	counter(descSessions, float64(ts.Committed), "committed")
	counter(descSessions, float64(ts.Failed), "failed")
	for kind, v := range map[string]int64{"auth": ts.AuthFailures, "protocol": ts.ProtocolErrors, "checksum": ts.ChecksumFailures, "connection": ts.ConnErrors} {
		counter(descTErrors, float64(v), kind)
	}
	gauge(descTHeld, float64(ts.HeldBytes))
}

// acceptedHistogram turns runs[a], the verifications that accepted a
// drafts, into a histogram with a bucket per count up to MaxDraft.
func acceptedHistogram(runs []int64) (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = make(map[float64]uint64, pipeline.MaxDraft+1)
	for a := 0; a <= pipeline.MaxDraft; a++ {
		if a < len(runs) {
			count += uint64(runs[a])
			sum += float64(a) * float64(runs[a])
		}
		buckets[float64(a)] = count
	}
	return count, sum, buckets
}
