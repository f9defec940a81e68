package model_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// The reference must compute the same bits on amd64 (prefill boxes) and
// arm64 (decode workers): a state prefilled on one is decoded on the
// other. TestCrossArchBits runs crossArchOutputs natively and in this test
// binary built for arm64 under qemu-user, and compares the bytes.

const (
	crossArchModelEnv = "TANDEM_CROSSARCH_MODEL"
	crossArchOutEnv   = "TANDEM_CROSSARCH_OUT"
)

// crossArchOutputs runs a 70-token prompt (two KDA chunks, a partial one
// last) through the checkpoint in dir: the prefill form's last logits, the
// prefill state of prompt[:-1] with exact fp32 MLA latents, encoded, and
// the decode form's logits for the last prompt token and two greedy
// steps after it. Each part is length-prefixed.
func crossArchOutputs(dir string) ([]byte, error) {
	m, err := model.Load(dir, cpu.New(2), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	m.State.LatentDType = model.F32
	ctx := context.Background()
	p := testkit.Prompt(70, m.Cfg.VocabSize, 0)
	var out bytes.Buffer
	part := func(b []byte) {
		out.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(b))))
		out.Write(b)
	}
	f32 := func(v []float32) []byte {
		b := make([]byte, 0, 4*len(v))
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	l, err := m.Prefill(ctx, []*model.SeqState{m.NewState(0, m.Cfg.NumLayers)}, [][]int32{p})
	if err != nil {
		return nil, err
	}
	part(f32(l[0]))
	s, logits, err := m.Start(ctx, p)
	if err != nil {
		return nil, err
	}
	st := m.NewState(0, m.Cfg.NumLayers)
	if err := m.PrefillState(ctx, []*model.SeqState{st}, [][]int32{p[:len(p)-1]}); err != nil {
		return nil, err
	}
	enc, err := st.MarshalBinary()
	if err != nil {
		return nil, err
	}
	part(enc)
	part(f32(logits))
	for i := 0; i < 2; i++ {
		l, err := m.Decode(ctx, []*model.SeqState{s}, []int32{int32(model.Argmax(logits))})
		if err != nil {
			return nil, err
		}
		logits = l[0]
		part(f32(logits))
	}
	return out.Bytes(), nil
}

// TestCrossArchHelper is the arm64 side of TestCrossArchBits: it runs only
// when that test starts it, with the checkpoint and the output file in
// the environment.
func TestCrossArchHelper(t *testing.T) {
	dir, outFile := os.Getenv(crossArchModelEnv), os.Getenv(crossArchOutEnv)
	if dir == "" || outFile == "" {
		t.Skip("started by TestCrossArchBits only")
	}
	b, err := crossArchOutputs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCrossArchBits: logits (prefill and decode forms) and an encoded
// prefill state of a random tiny checkpoint are byte-identical between
// this amd64 run and an arm64 run of the same code under qemu-user.
func TestCrossArchBits(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the native side of this comparison is amd64")
	}
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		t.Skip("qemu-aarch64-static is not installed (scripts/setup.sh installs Debian's qemu-user-static): the arm64 comparison is skipped")
	}
	gobin, err := exec.LookPath("go") // go test puts its own go first in PATH
	if err != nil {
		t.Fatal(err)
	}
	dir := testmodel.Dir(t, "tiny", 1, 2)
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "model.arm64.test")
	build := exec.Command(gobin, "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building this package's tests for arm64: %v\n%s", err, out)
	}
	outFile := filepath.Join(tmp, "arm64.bin")
	run := exec.Command(qemu, bin, "-test.run=^TestCrossArchHelper$", "-test.count=1")
	run.Env = append(os.Environ(), crossArchModelEnv+"="+dir, crossArchOutEnv+"="+outFile)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("the arm64 run under qemu: %v\n%s", err, out)
	}
	arm, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	native, err := crossArchOutputs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(native, arm) {
		t.Fatalf("arm64 differs from amd64: %s", describeDiff(native, arm))
	}
	t.Logf("amd64 (%s kernels) and arm64 under qemu agree on %d bytes of logits and state", cpu.KernelName(), len(native))
}

// describeDiff names the part and the number of 4-byte words that differ.
func describeDiff(a, b []byte) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d bytes vs %d", len(a), len(b))
	}
	names := []string{"prefill logits", "prefill state", "decode logits (last prompt token)", "decode logits (step 1)", "decode logits (step 2)"}
	var msg string
	for i, off := 0, 0; off+8 <= len(a) && i < len(names); i++ {
		n := int(binary.LittleEndian.Uint64(a[off:]))
		pa, pb := a[off+8:off+8+n], b[off+8:off+8+n]
		words := 0
		for j := 0; j+4 <= n; j += 4 {
			if !bytes.Equal(pa[j:j+4], pb[j:j+4]) {
				words++
			}
		}
		if words > 0 {
			msg += fmt.Sprintf("%s: %d of %d words; ", names[i], words, n/4)
		}
		off += 8 + n
	}
	return msg
}
