package safetensors

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStubsAreNotRead: a shard StubsFile names keeps its header (the
// tensor table, shapes and runs' places are read as before) but its data
// are refused, naming the shard, the tensor and what to do, by every read
// (Bytes, ReadTensor, Runs, NeedData); the other shard reads as before. A
// malformed StubsFile, or one naming a file that is not a shard, fails
// Open; a directory without one (a sparse synthetic checkpoint) has no
// stubs.
func TestStubsAreNotRead(t *testing.T) {
	dir := copyFixture(t)
	writeIndex(t, dir, func(map[string]string) {})
	stubs := func(body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, StubsFile), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stubs(`{"layers": [0, 1], "globals": false, "stubs": ["model-00002-of-00002.safetensors"]}`)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stub := filepath.Join(dir, "model-00002-of-00002.safetensors")
	if got := c.Stubs(); len(got) != 1 || got[0] != stub {
		t.Fatalf("Stubs() = %q", got)
	}
	if _, ok := c.Tensor("second.shard.f32"); !ok {
		t.Fatal("a stub's tensor is not listed")
	}
	refused := func(what string, err error) {
		t.Helper()
		var e *Error
		if !errors.Is(err, ErrStub) || !errors.As(err, &e) || e.File != stub || e.Tensor != "second.shard.f32" {
			t.Fatalf("%s of a stub's tensor: %v", what, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "bench checkpoint shards --copy") || !strings.Contains(msg, "full checkpoint") {
			t.Fatalf("%s: the error does not say what to do: %s", what, msg)
		}
	}
	_, err = c.Bytes("second.shard.f32")
	refused("Bytes", err)
	refused("ReadTensor", c.ReadTensor("second.shard.f32", make([]byte, 400)))
	_, err = c.Runs([]string{"plain.f32.2d", "second.shard.f32"})
	refused("Runs", err)
	refused("NeedData", c.NeedData("plain.f32.2d", "second.shard.f32"))
	if err := c.NeedData("plain.f32.2d", "scalar.f32"); err != nil {
		t.Fatalf("the copied shard's tensors: %v", err)
	}
	if _, err := c.Bytes("plain.f32.2d"); err != nil {
		t.Fatal(err)
	}
	if err := c.NeedData("no.such.tensor"); !errors.Is(err, ErrMissing) {
		t.Fatalf("an unknown tensor: %v", err)
	}

	for body, want := range map[string]string{
		`{"stubs": ["model-00009-of-00009.safetensors"]}`:    "is not a shard of the checkpoint",
		`{"stubs": ["../model-00002-of-00002.safetensors"]}`: "not a file name inside the checkpoint directory",
		`{"stubs": "model-00002-of-00002.safetensors"}`:      "malformed",
		`{"stubs": [`: "malformed",
		`{"stubs": ["` + strings.Repeat("x", maxStubsFile) + `"]}`: "longer than",
	} {
		stubs(body)
		c, err := Open(dir)
		if err == nil {
			c.Close()
			t.Fatalf("%.60s: opened", body)
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), StubsFile) {
			t.Fatalf("%.60s: %v, want %q naming %s", body, err, want, StubsFile)
		}
	}
	if err := os.Remove(filepath.Join(dir, StubsFile)); err != nil {
		t.Fatal(err)
	}
	c2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if len(c2.Stubs()) != 0 {
		t.Fatalf("stubs without %s: %q", StubsFile, c2.Stubs())
	}
	if _, err := c2.Bytes("second.shard.f32"); err != nil {
		t.Fatal(err)
	}
}
