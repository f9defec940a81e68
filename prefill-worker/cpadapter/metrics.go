package cpadapter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-inference/tandem/internal/health"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

const ns = "tandem_prefill"

// Metrics are the prefill worker's Prometheus metrics: what its scheduler
// counts (read at each scrape), the time of each layer and pass, its
// memory plan, the state bytes it sent and the transfer errors, and the
// assignments it took or refused. A nil *Metrics records nothing.
type Metrics struct {
	reg           *prometheus.Registry
	budget        int64
	layer         prometheus.Histogram
	pass          prometheus.Histogram
	assignments   *health.Assignments
	transferBytes prometheus.Counter
	transferErrs  *prometheus.CounterVec
}

// NewMetrics makes the metrics on reg; budget is the worker's memory
// budget. Call Watch once the worker exists, and give the worker's Config
// OnLayer and OnPass to the metrics' methods.
func NewMetrics(reg *prometheus.Registry, budget int64) *Metrics {
	secs := prometheus.ExponentialBuckets(0.0005, 2, 24) // 0.5 ms .. ~70 min
	m := &Metrics{reg: reg, budget: budget,
		layer: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "layer_seconds",
			Help: "Time to bind and run one layer of a pass over all its jobs' rows (without the wait for its weights).", Buckets: secs}),
		pass: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "pass_seconds",
			Help: "Weight pass wall time: its start to its last layer done.", Buckets: secs}),
		assignments: health.NewAssignments(reg, ns,
			"Assignments answered, by outcome: accepted, resumed (a job held or ended here) or refused."),
		transferBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "transfer_bytes_total",
			Help: "State bytes sent to decode ranks over kvtransfer (chunk payloads, resends included), counted when each job ends."}),
		transferErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "transfer_errors_total",
			Help: "kvtransfer errors the senders recovered from, by kind: connection (lost and redialed) or checksum (a chunk a receiver rejected)."}, []string{"kind"}),
	}
	for _, k := range []string{"connection", "checksum"} {
		m.transferErrs.WithLabelValues(k) // exported at 0 before the first
	}
	reg.MustRegister(m.layer, m.pass, m.transferBytes, m.transferErrs)
	return m
}

// Watch exports w's counters, read at each scrape.
func (m *Metrics) Watch(w *worker.Worker) {
	if m != nil {
		m.reg.MustRegister(health.Collector{Descs: descs, Read: func(s health.Sink) { collect(s, w, m.budget) }})
	}
}

// Layer records one layer of a pass (worker.Config.OnLayer).
func (m *Metrics) Layer(p executor.Progress) {
	if m != nil && p.LayerCompute > 0 {
		m.layer.Observe(p.LayerCompute.Seconds())
	}
}

// Pass records a finished pass (worker.Config.OnPass).
func (m *Metrics) Pass(r scheduler.PassReport) {
	if m != nil && r.Stats.Wall > 0 {
		m.pass.Observe(r.Stats.Wall.Seconds())
	}
}

func (m *Metrics) assignment(outcome string) {
	if m != nil {
		m.assignments.Count(outcome)
	}
}

// transfer records a finished job's sender.
func (m *Metrics) transfer(st kvtransfer.SenderStats) {
	if m == nil {
		return
	}
	m.transferBytes.Add(float64(max(st.BytesSent, 0)))
	m.transferErrs.WithLabelValues("connection").Add(float64(max(st.ConnErrors, 0)))
	m.transferErrs.WithLabelValues("checksum").Add(float64(max(st.ChecksumErrors, 0)))
}

var (
	descQueued   = prometheus.NewDesc(ns+"_jobs_queued", "Jobs waiting for a weight pass to start.", nil, nil)
	descRunning  = prometheus.NewDesc(ns+"_jobs_running", "Jobs in a pass (started and not finished).", nil, nil)
	descJobs     = prometheus.NewDesc(ns+"_jobs_total", "Jobs that ended, by state: done, failed or cancelled.", []string{"state"}, nil)
	descPasses   = prometheus.NewDesc(ns+"_passes_total", "Weight passes run.", nil, nil)
	descTokens   = prometheus.NewDesc(ns+"_tokens_total", "Prompt tokens prefilled.", nil, nil)
	descRead     = prometheus.NewDesc(ns+"_weight_read_bytes_total", "Weight bytes read from disk.", nil, nil)
	descTime     = prometheus.NewDesc(ns+"_time_seconds_total", "Time spent, by part: compute (binding and running layers), pass (pass wall time) and read_wait (compute idle, waiting for weights).", []string{"part"}, nil)
	descBudget   = prometheus.NewDesc(ns+"_memory_budget_bytes", "The worker's memory budget.", nil, nil)
	descPlanned  = prometheus.NewDesc(ns+"_pass_memory_bytes", "Memory the latest pass planned, by part: ring (weights in flight), states (the jobs' KV and KDA state), activations, temporaries, draining (states still leaving for their sinks), total.", []string{"part"}, nil)
	descReadRate = prometheus.NewDesc(ns+"_read_bytes_per_second", "Weight read rate measured over every pass (bytes over the time reads were in flight); 0 before the first.", nil, nil)
)

var descs = []*prometheus.Desc{descQueued, descRunning, descJobs, descPasses, descTokens, descRead, descTime, descBudget, descPlanned, descReadRate}

// collect reads the worker's Stats; budget is its memory budget.
func collect(s health.Sink, w *worker.Worker, budget int64) {
	st := w.Stats()
	gauge, counter := s.Gauge, s.Counter
	gauge(descQueued, float64(st.Queued))
	gauge(descRunning, float64(st.InProgress))
	counter(descJobs, float64(st.Completed), "done")
	counter(descJobs, float64(st.Failed), "failed")
	counter(descJobs, float64(st.Cancelled), "cancelled")
	counter(descPasses, float64(st.Passes))
	counter(descTokens, float64(st.TokensPrefilled))
	counter(descRead, float64(st.BytesRead))
	for part, d := range map[string]time.Duration{"compute": st.ComputeTime, "pass": st.PassTime, "read_wait": st.ReadWait} {
		counter(descTime, d.Seconds(), part)
	}
	gauge(descBudget, float64(budget))
	var mem struct{ ring, states, act, tmp, draining, total int64 }
	if lp := st.LastPass; lp != nil {
		pm := lp.Plan.Mem
		mem.ring, mem.states, mem.act, mem.tmp, mem.draining, mem.total = pm.Ring, pm.States, pm.Activations, pm.Temporaries, pm.Draining, pm.Total
	}
	for part, v := range map[string]int64{"ring": mem.ring, "states": mem.states, "activations": mem.act, "temporaries": mem.tmp,
		"draining": mem.draining, "total": mem.total} {
		gauge(descPlanned, float64(v), part)
	}
	gauge(descReadRate, st.ReadBytesPerSec)
}
