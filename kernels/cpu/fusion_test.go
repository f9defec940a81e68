package cpu

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestNoImplicitFusion compiles the numeric packages (the reference's, its
// exp and tanh, and the decode workers' sampling) for arm64
// and checks that every fused multiply-add in them comes from an explicit
// math.FMA: Go fuses a*b+c on arm64 (never on amd64), and a fusion nobody
// wrote changes the bits in the last place, which fp32 rounding hides from
// most end-to-end comparisons (TestCrossArchBits) but not from all.
func TestNoImplicitFusion(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles seven packages for arm64")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	pkgs := []string{".", "../../internal/expmath", "../../mxfp", "../../model", "../../model/synth", "../../model/vision", "../../decode-worker/sampling"}
	cmd := exec.Command(gobin, append([]string{"build", "-o", os.DevNull, "-gcflags=-S"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build for arm64: %v\n%.2000s", err, out)
	}
	fused := regexp.MustCompile(`\((\S+\.go):(\d+)\)\s+F(N?M(ADD|SUB))[SD]\s`)
	seen := 0
	for _, m := range fused.FindAllStringSubmatch(string(out), -1) {
		seen++
		src, err := os.ReadFile(m[1])
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(m[2])
		lines := strings.Split(string(src), "\n")
		if n < 1 || n > len(lines) || !strings.Contains(lines[n-1], "math.FMA(") {
			t.Errorf("%s:%s: the compiler fuses a multiply-add nobody asked for (round the product with float64()/float32(), or write math.FMA)", m[1], m[2])
		}
	}
	if seen == 0 {
		t.Fatal("no fused multiply-add found at all: the listing's format changed, this test checks nothing")
	}
}
