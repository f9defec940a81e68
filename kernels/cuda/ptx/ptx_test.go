package ptx

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestModulesTargetArch checks every embedded module is PTX for Arch with at
// least one kernel entry.
func TestModulesTargetArch(t *testing.T) {
	mods := Modules()
	if len(mods) == 0 {
		t.Fatal("no PTX modules embedded")
	}
	for name, text := range mods {
		if !strings.Contains(text, "\n.target "+Arch+"\n") {
			t.Errorf("module %s: no .target %s line", name, Arch)
		}
		if !strings.Contains(text, ".visible .entry tandem_") {
			t.Errorf("module %s: no tandem_ kernel entry", name)
		}
		if got, ok := Module(name); !ok || got != text {
			t.Errorf("Module(%q) disagrees with Modules()", name)
		}
	}
	if _, ok := Module("no-such-module"); ok {
		t.Error("Module of a missing name reported ok")
	}
}

// TestABIListsEveryEntry checks ABI.md and the PTX name the same kernels in
// the same modules: every `module.tandem_x` heading of ABI.md is an entry of
// that module, and every entry has a heading.
func TestABIListsEveryEntry(t *testing.T) {
	doc, err := os.ReadFile("../src/ABI.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^### `([a-z_]+)\\.(tandem_[a-z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]+"."+m[2]] = true
	}
	entry := regexp.MustCompile(`\.visible \.entry (tandem_[a-z0-9_]+)\(`)
	present := map[string]bool{}
	for name, text := range Modules() {
		for _, m := range entry.FindAllStringSubmatch(text, -1) {
			present[name+"."+m[1]] = true
		}
	}
	for k := range present {
		if !documented[k] {
			t.Errorf("kernel %s is in the PTX but has no heading in ABI.md", k)
		}
	}
	for k := range documented {
		if !present[k] {
			t.Errorf("ABI.md documents %s, which no PTX module defines", k)
		}
	}
}
