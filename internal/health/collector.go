package health

import "github.com/prometheus/client_golang/prometheus"

// Collector exports figures read at each scrape (a worker's own counters)
// instead of kept in Prometheus types: Read sends a value for each of
// Descs through the Sink.
type Collector struct {
	Descs []*prometheus.Desc
	Read  func(Sink)
}

// Describe sends the collector's descriptions.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.Descs {
		ch <- d
	}
}

// Collect reads the figures.
func (c Collector) Collect(ch chan<- prometheus.Metric) { c.Read(Sink{ch}) }

// Sink takes a Collector's values.
type Sink struct{ ch chan<- prometheus.Metric }

// Gauge sends a gauge's value.
func (s Sink) Gauge(d *prometheus.Desc, v float64, labels ...string) {
	s.ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// Counter sends a counter's value.
func (s Sink) Counter(d *prometheus.Desc, v float64, labels ...string) {
	s.ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

// Histogram sends a histogram of count observations summing to sum, with
// the cumulative count at each upper bound.
func (s Sink) Histogram(d *prometheus.Desc, count uint64, sum float64, buckets map[float64]uint64, labels ...string) {
	s.ch <- prometheus.MustNewConstHistogram(d, count, sum, buckets, labels...)
}

// Assignments counts the assignments a worker answered, by outcome:
// accepted, resumed (a job held or ended here) or refused, each exported
// at 0 before the first. A nil *Assignments counts nothing.
type Assignments struct{ v *prometheus.CounterVec }

// NewAssignments makes namespace_assignments_total on reg; help says whose
// assignments they are.
func NewAssignments(reg prometheus.Registerer, namespace, help string) *Assignments {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "assignments_total", Help: help}, []string{"outcome"})
	for _, o := range []string{"accepted", "resumed", "refused"} {
		v.WithLabelValues(o)
	}
	reg.MustRegister(v)
	return &Assignments{v: v}
}

// Count counts one assignment answered with outcome.
func (a *Assignments) Count(outcome string) {
	if a != nil {
		a.v.WithLabelValues(outcome).Inc()
	}
}
