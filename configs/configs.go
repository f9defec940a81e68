// Package configs holds tandem's configuration files, embedded so that the
// binaries work from any directory: synthetic model presets (models/*.json,
// each a config.json in the released nested shape), cluster layouts
// (*.yaml), hardware profiles (hardware/*.yaml) and Grafana dashboards
// (grafana-*.json).
package configs

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
)

//go:embed models hardware *.yaml grafana-*.json
var files embed.FS

// FS exposes the embedded files.
func FS() fs.FS { return files }

// ModelPreset returns the config.json of a synthetic model preset.
func ModelPreset(name string) ([]byte, error) {
	b, err := files.ReadFile(path.Join("models", name+".json"))
	if err != nil {
		return nil, fmt.Errorf("no model preset %q (have %s)", name, strings.Join(ModelPresets(), ", "))
	}
	return b, nil
}

// ModelPresets lists the preset names.
func ModelPresets() []string {
	ents, _ := files.ReadDir("models")
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// HardwareProfile returns the YAML of a hardware profile (hardware/NAME.yaml):
// a prefill box, a decode group, a link, or this machine as measured by
// bench calibrate. The simulator (bench/sim) parses it.
func HardwareProfile(name string) ([]byte, error) {
	b, err := files.ReadFile(path.Join("hardware", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("no hardware profile %q (have %s)", name, strings.Join(HardwareProfiles(), ", "))
	}
	return b, nil
}

// HardwareProfiles lists the hardware profile names.
func HardwareProfiles() []string {
	ents, _ := files.ReadDir("hardware")
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Layout returns a cluster layout (NAME.yaml at the top of configs): the
// coordinator's configuration of a deployment (local, cluster) or its
// decode group's file (local-group, cluster-group).
func Layout(name string) ([]byte, error) {
	b, err := files.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("no cluster layout %q (have %s)", name, strings.Join(Layouts(), ", "))
	}
	return b, nil
}

// Layouts lists the cluster layout names.
func Layouts() []string {
	ents, _ := files.ReadDir(".")
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok && !e.IsDir() {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// MetricPrefixes are the prefixes of the metrics tandem's processes
// export: the coordinator's, the prefill worker's, a decode rank's, and the
// Go runtime and process collectors every one of them serves.
var MetricPrefixes = []string{"tandem_coordinator_", "tandem_prefill_", "tandem_decode_", "go_", "process_"}

// Dashboards lists the Grafana dashboards' file names.
func Dashboards() []string {
	names, _ := fs.Glob(files, "grafana-*.json")
	sort.Strings(names)
	return names
}

// DashboardMetrics returns the metric names the queries (every "expr") of
// dashboard file name select, sorted, each once.
func DashboardMetrics(name string) ([]string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", name, err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", name, err)
	}
	seen := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if s, ok := e.(string); ok && k == "expr" {
					for _, m := range promMetrics(s) {
						seen[m] = true
					}
				}
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	if len(seen) == 0 {
		return nil, fmt.Errorf("dashboard %s: no query selects a metric", name)
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out, nil
}

var (
	// What a PromQL expression holds besides metric names: label
	// matchers, quoted strings, ranges and label lists, then identifiers
	// that are functions (followed by a parenthesis) or keywords.
	promNoise = []*regexp.Regexp{
		regexp.MustCompile(`"(?:[^"\\]|\\.)*"`),
		regexp.MustCompile(`\{[^}]*\}`),
		regexp.MustCompile(`\[[^\]]*\]`),
		regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
	}
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}
)

// promMetrics returns the metric names a PromQL expression selects.
func promMetrics(expr string) []string {
	for _, re := range promNoise {
		expr = re.ReplaceAllString(expr, " ")
	}
	var out []string
	for _, m := range promIdent.FindAllStringSubmatchIndex(expr, -1) {
		id := expr[m[0]:m[1]]
		if m[2] >= 0 || promKeywords[strings.ToLower(id)] || strings.HasPrefix(id, "$") {
			continue // a function call or a keyword
		}
		if m[0] > 0 && (expr[m[0]-1] == '$' || expr[m[0]-1] >= '0' && expr[m[0]-1] <= '9' || expr[m[0]-1] == '.') {
			continue // part of a variable or a number (1e3)
		}
		out = append(out, id)
	}
	return out
}
