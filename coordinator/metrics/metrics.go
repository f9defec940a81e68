// Package metrics holds the coordinator's Prometheus metrics: queue depth,
// jobs by outcome, routing decisions and their predictions, time to first
// token, each job's mean inter-token latency, prompt and output tokens, prefill pass times,
// transfer tails, decode rates and the control plane's own overhead
// (submission to assignment). The process serves them on /metrics with
// package internal/health.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const ns = "tandem_coordinator"

// Metrics are the coordinator's metrics, on their own registry. A nil
// *Metrics records nothing, so callers need no checks.
type Metrics struct {
	reg *prometheus.Registry

	queueWaiting, queueInFlight prometheus.Gauge
	running                     prometheus.Gauge
	workers                     *prometheus.GaugeVec
	submitted                   *prometheus.CounterVec
	finished                    *prometheus.CounterVec
	routes                      *prometheus.CounterVec
	predicted                   *prometheus.HistogramVec
	ttft                        *prometheus.HistogramVec
	passTime                    prometheus.Histogram
	transferTail                prometheus.Histogram
	decodeRate                  prometheus.Histogram
	interToken                  *prometheus.HistogramVec
	tokens                      *prometheus.CounterVec
	assignOverhead              prometheus.Histogram
	droppedRequests             *prometheus.CounterVec
	prefixCache                 map[string]*prometheus.GaugeVec
}

// prefixCacheFields are the decode ranks' prefix-cache figures, as their
// heartbeats report them (counters since each rank started).
var prefixCacheFields = []struct{ name, help string }{
	{"prefix_cache_entries", "Cached prefixes a decode rank holds."},
	{"prefix_cache_bytes", "Bytes of a decode rank's memory budget its prefix cache holds."},
	{"prefix_cache_lookups", "Prompts the group's head looked up in its prefix cache (since the rank started)."},
	{"prefix_cache_hits", "Lookups that resumed from a cached prefix (since the rank started)."},
	{"prefix_cache_hit_tokens", "Prompt tokens taken from the prefix cache instead of prefilled (since the rank started)."},
	{"prefix_cache_misses", "Lookups that found nothing, and entries a rank lacked (since the rank started)."},
	{"prefix_cache_evictions", "Cached prefixes dropped to make room (since the rank started)."},
}

// New makes the metrics (health.New adds the Go runtime and process
// collectors to their registry).
func New() *Metrics {
	secs := prometheus.ExponentialBuckets(0.001, 2, 22) // 1 ms .. ~35 min
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		queueWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "queue_waiting_jobs",
			Help: "Jobs stored in the job queue and not yet delivered to a coordinator."}),
		queueInFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "queue_in_flight_jobs",
			Help: "Jobs delivered to coordinators and not yet in a final state (all coordinators)."}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "running_jobs",
			Help: "Jobs this coordinator is driving."}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "workers",
			Help: "Live workers in the registry, by kind."}, []string{"kind"}),
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "submissions_total",
			Help: "Submissions answered, by outcome (accepted, duplicate, or the error code)."}, []string{"outcome"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "jobs_total",
			Help: "Jobs that reached a final state, by state."}, []string{"state"}),
		routes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "route_decisions_total",
			Help: "Routing decisions, by policy and target."}, []string{"policy", "target"}),
		predicted: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "predicted_ttft_seconds",
			Help: "The router's predicted time to first token of each routed job, by side.", Buckets: secs}, []string{"side"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "ttft_seconds",
			Help: "Submission to first token, by where the prompt was prefilled.", Buckets: secs}, []string{"target"}),
		passTime: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "prefill_pass_seconds",
			Help: "Remote prefill: the weight pass start to the last layer computed.", Buckets: secs}),
		transferTail: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "transfer_tail_seconds",
			Help: "Remote prefill: the last layer computed to every rank's commit.", Buckets: secs}),
		decodeRate: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "decode_tokens_per_second",
			Help:    "Decode rate of each finished job (tokens after the first, per second).",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 16)}),
		// The coordinator does not see the tokens (rank 0 publishes them
		// to the job's client): it knows a job's decode time and token
		// count only at its end, so this is one mean per job. Every gap
		// is rank 0's tandem_decode_inter_token_seconds.
		interToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "job_mean_inter_token_seconds",
			Help:    "Per finished job with two or more output tokens, the mean time between two of them (its first token to its last, over the tokens after the first), by where it was prefilled; one observation per job, not per token (rank 0's tandem_decode_inter_token_seconds has every gap).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}, []string{"target"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tokens_total",
			Help: "Tokens of finished jobs, by kind: prompt (all of it), cached (prompt tokens a prefix cache served) and output."}, []string{"kind"}),
		droppedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dropped_requests_total",
			Help: "Client requests dropped unanswered because their reply subject was not the client's own inbox, by request (submit, cancel, list, availability)."}, []string{"request"}),
		assignOverhead: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "submit_to_assign_seconds",
			Help:    "Control-plane overhead: submission to the workers' acceptance of the assignment.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20)}),
	}
	m.prefixCache = map[string]*prometheus.GaugeVec{}
	for _, f := range prefixCacheFields {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: f.name, Help: f.help}, []string{"worker"})
		m.prefixCache[f.name] = g
		m.reg.MustRegister(g)
	}
	for _, k := range []string{"prompt", "cached", "output"} {
		m.tokens.WithLabelValues(k) // exported at 0 before the first job
	}
	m.reg.MustRegister(m.interToken, m.tokens,
		m.queueWaiting, m.queueInFlight, m.running, m.workers, m.submitted, m.finished, m.routes, m.predicted,
		m.ttft, m.passTime, m.transferTail, m.decodeRate, m.assignOverhead, m.droppedRequests)
	return m
}

// Registry is the registry the metrics are on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Queue records the job queue's counters.
func (m *Metrics) Queue(waiting uint64, inFlight int) {
	if m == nil {
		return
	}
	m.queueWaiting.Set(float64(waiting))
	m.queueInFlight.Set(float64(inFlight))
}

// Running records the jobs this coordinator drives.
func (m *Metrics) Running(n int) {
	if m != nil {
		m.running.Set(float64(n))
	}
}

// Workers records the live workers of one kind.
func (m *Metrics) Workers(kind string, n int) {
	if m != nil {
		m.workers.WithLabelValues(kind).Set(float64(n))
	}
}

// PrefixCache is one decode rank's prefix-cache figures, for PrefixCaches.
type PrefixCache struct {
	Entries                                            int
	Bytes, Lookups, Hits, HitTokens, Misses, Evictions uint64
}

// PrefixCaches records the live decode ranks' prefix caches by worker id;
// ranks no longer listed are dropped.
func (m *Metrics) PrefixCaches(byWorker map[string]PrefixCache) {
	if m == nil {
		return
	}
	for _, g := range m.prefixCache {
		g.Reset()
	}
	for w, c := range byWorker {
		for name, v := range map[string]float64{"prefix_cache_entries": float64(c.Entries), "prefix_cache_bytes": float64(c.Bytes),
			"prefix_cache_lookups": float64(c.Lookups), "prefix_cache_hits": float64(c.Hits), "prefix_cache_hit_tokens": float64(c.HitTokens),
			"prefix_cache_misses": float64(c.Misses), "prefix_cache_evictions": float64(c.Evictions)} {
			m.prefixCache[name].WithLabelValues(w).Set(v)
		}
	}
}

// DroppedRequest counts a client request (submit, cancel, list or
// availability) dropped unanswered for its reply subject.
func (m *Metrics) DroppedRequest(request string) {
	if m != nil {
		m.droppedRequests.WithLabelValues(request).Inc()
	}
}

// Submission counts a submission's outcome.
func (m *Metrics) Submission(outcome string) {
	if m != nil {
		m.submitted.WithLabelValues(outcome).Inc()
	}
}

// Route records a routing decision and both predictions.
func (m *Metrics) Route(policy, target string, local, remote time.Duration) {
	if m == nil {
		return
	}
	m.routes.WithLabelValues(policy, target).Inc()
	m.predicted.WithLabelValues("local").Observe(local.Seconds())
	if remote > 0 {
		m.predicted.WithLabelValues("remote").Observe(remote.Seconds())
	}
}

// Assigned records the control plane's overhead for one job.
func (m *Metrics) Assigned(overhead time.Duration) {
	if m != nil {
		m.assignOverhead.Observe(overhead.Seconds())
	}
}

// Finished records a final job: its state and, when measured, its time to
// first token, pass time, transfer tail and decode rate.
func (m *Metrics) Finished(state, target string, ttft, pass, tail time.Duration, decodeTokS float64) {
	if m == nil {
		return
	}
	m.finished.WithLabelValues(state).Inc()
	if ttft > 0 {
		m.ttft.WithLabelValues(target).Observe(ttft.Seconds())
	}
	if pass > 0 {
		m.passTime.Observe(pass.Seconds())
	}
	if tail > 0 {
		m.transferTail.Observe(tail.Seconds())
	}
	if decodeTokS > 0 {
		m.decodeRate.Observe(decodeTokS)
	}
}

// Tokens counts a final job's tokens and records its mean inter-token
// latency: decode is its first token to its last.
func (m *Metrics) Tokens(target string, prompt, cached, output int, decode time.Duration) {
	if m == nil {
		return
	}
	m.tokens.WithLabelValues("prompt").Add(float64(max(prompt, 0)))
	m.tokens.WithLabelValues("cached").Add(float64(max(cached, 0)))
	m.tokens.WithLabelValues("output").Add(float64(max(output, 0)))
	if output >= 2 && decode > 0 {
		m.interToken.WithLabelValues(target).Observe(decode.Seconds() / float64(output-1))
	}
}
