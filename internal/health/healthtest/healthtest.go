// Package healthtest reads the operations endpoint of a real process for
// tests: /metrics parsed from the Prometheus text format, the samples of a
// family, and the check that every metric a dashboard queries is exported.
package healthtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tandem-inference/tandem/configs"
)

// Families are a scrape's metric families by name.
type Families map[string]*dto.MetricFamily

// Get fetches url and returns its status and body.
func Get(url string) (int, string, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Scrape fetches base+"/metrics" and parses it.
func Scrape(base string) (Families, error) {
	code, body, err := Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %d %s", base, code, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", base, err)
	}
	return fams, nil
}

// ScrapeWhen scrapes base until ok accepts what it read, or ctx ends: a
// process may count what a test just saw end a moment later (a worker
// records a job once its own part is over, which the client need not wait
// for).
func ScrapeWhen(ctx context.Context, base string, ok func(Families) bool) (Families, error) {
	for {
		f, err := Scrape(base)
		if err == nil && ok(f) {
			return f, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				return f, nil // the caller's checks say what is wrong
			}
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Value is the sum over family name's samples whose labels include every
// pair of labels (name, value, name, value...): a counter's or gauge's
// value, a histogram's observation count. A family that is absent is 0.
func (f Families) Value(name string, labels ...string) float64 {
	fam := f[name]
	if fam == nil {
		return 0
	}
	var sum float64
	for _, m := range fam.Metric {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range m.Label {
			if l.GetName() == want[i] && l.GetValue() == want[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Exports reports whether the scrape has metric name: a family of that
// name, or a histogram's _bucket, _sum or _count series.
func (f Families) Exports(name string) bool {
	if f[name] != nil {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if fam := f[base]; fam != nil && fam.GetType() == dto.MetricType_HISTOGRAM {
				return true
			}
		}
	}
	return false
}

// DashboardsMissing returns, for every dashboard in configs, the metrics
// its queries select that start with one of prefixes and that the scrape
// does not export.
func (f Families) DashboardsMissing(prefixes ...string) ([]string, error) {
	var missing []string
	for _, d := range configs.Dashboards() {
		names, err := configs.DashboardMetrics(d)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			for _, p := range prefixes {
				if strings.HasPrefix(n, p) && !f.Exports(n) {
					missing = append(missing, d+": "+n)
				}
			}
		}
	}
	return missing, nil
}
