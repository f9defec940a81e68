package metal

import (
	"errors"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func names(re *regexp.Regexp, text string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

// TestABICoversEveryKernel: the library's kernels, src/ABI.md's headings and
// the emulator driver's table name the same kernels.
func TestABICoversEveryKernel(t *testing.T) {
	lib := names(regexp.MustCompile(`(?m)^kernel void (\w+)\(`), Source())
	if len(lib) == 0 {
		t.Fatal("no kernels in the library source")
	}
	abi, err := os.ReadFile("src/ABI.md")
	if err != nil {
		t.Fatal(err)
	}
	if doc := names(regexp.MustCompile(`(?m)^### (\w+)$`), string(abi)); !slices.Equal(doc, lib) {
		t.Errorf("ABI.md documents %v, the library has %v", doc, lib)
	}
	drv, err := os.ReadFile("emu/driver/driver.cc")
	if err != nil {
		t.Fatal(err)
	}
	if tab := names(regexp.MustCompile(`\bK\((tandem_\w+)\)`), string(drv)); !slices.Equal(tab, lib) {
		t.Errorf("the emulator driver dispatches %v, the library has %v", tab, lib)
	}
}

// TestSourceIsOneFile: what newLibraryWithSource gets has no #include the
// device compiler would have to resolve (only the emulator's, which its
// #ifdef skips) and carries the shared numerics.
func TestSourceIsOneFile(t *testing.T) {
	src := Source()
	inEmu := false
	for i, line := range strings.Split(src, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case l == "#ifdef METALEMU":
			inEmu = true
		case inEmu && (l == "#else" || l == "#endif"):
			inEmu = false
		case strings.HasPrefix(l, `#include "`) && !inEmu:
			t.Errorf("line %d: %s", i+1, l)
		case l == "#pragma once":
			t.Errorf("line %d: #pragma once in the library source", i+1)
		}
	}
	for _, want := range []string{"#include <metal_stdlib>", "DEVICE float e2m1_value(", "DEVICE float tg_sum("} {
		if !strings.Contains(src, want) {
			t.Errorf("library source lacks %q", want)
		}
	}
}

func TestParams(t *testing.T) {
	a := params(3, int32(-1), float32(1.5), true)
	want := []byte{3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0xc0, 0x3f, 1, 0, 0, 0}
	if !slices.Equal(a.Bytes, want) {
		t.Errorf("params % x, want % x", a.Bytes, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("a negative uint parameter did not panic")
		}
	}()
	params(-1)
}

// TestOpenElsewhere: off macOS, Open says at once that Metal is not there.
func TestOpenElsewhere(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("on macOS Open reaches Metal")
	}
	_, err := Open()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "only available on macOS on Apple Silicon") {
		t.Fatalf("Open: %v", err)
	}
}
