// Package configs holds tandem's configuration files, embedded so that the
// binaries work from any directory: synthetic model presets (models/*.json,
// each a config.json in the released nested shape), cluster layouts
// (*.yaml) and hardware profiles (hardware/*.yaml).
package configs

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed models hardware *.yaml
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
