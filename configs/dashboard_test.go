package configs

import (
	"slices"
	"strings"
	"testing"
)

func TestPromMetrics(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.95, sum by (le) (rate(tandem_x_seconds_bucket[$__rate_interval])))`:                                                {"tandem_x_seconds_bucket"},
		`sum by (instance, part) (rate(a_total{part!="total", k=~"x|y"}[5m])) / ignoring(part) group_left sum by (instance) (rate(b_total[5m]))`: {"a_total", "b_total"},
		`go_goroutines`: {"go_goroutines"},
		`process_resident_memory_bytes > 1e9 and on(instance) up_thing offset 5m`: {"process_resident_memory_bytes", "up_thing"},
	} {
		if got := promMetrics(expr); !slices.Equal(got, want) {
			t.Errorf("promMetrics(%q) = %q, want %q", expr, got, want)
		}
	}
}

// TestDashboards: each dashboard parses and its queries select only
// metrics of tandem's processes (tandem_coordinator_, tandem_prefill_,
// tandem_decode_) or of the runtime collectors every process serves (go_,
// process_). That each of those is exported by a real process is checked
// where the processes run: coordinator TestMetricsAndHistoryAcrossRestart,
// prefill-worker TestMetricsAndDrain, decode-worker TestProcessMetrics.
func TestDashboards(t *testing.T) {
	names := Dashboards()
	if len(names) == 0 {
		t.Fatal("no dashboard")
	}
	for _, name := range names {
		ms, err := DashboardMetrics(name)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, m := range ms {
			i := slices.IndexFunc(MetricPrefixes, func(p string) bool { return strings.HasPrefix(m, p) })
			if i < 0 {
				t.Errorf("%s: metric %s is none of tandem's processes' (%q)", name, m, MetricPrefixes)
				continue
			}
			seen[MetricPrefixes[i]]++
		}
		for _, p := range MetricPrefixes {
			if seen[p] == 0 {
				t.Errorf("%s: no query on %s* metrics", name, p)
			}
		}
	}
}
