// Package testmodel provides synthetic checkpoints to tests, generated once
// per machine into the shared cache (synth.CacheDir) and shared by every
// test package. Only tests import it.
package testmodel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model/synth"
)

// Dir returns the directory of preset generated with seed into the given
// number of shards, generating it if needed.
func Dir(tb testing.TB, preset string, seed uint64, shards int) string {
	tb.Helper()
	dir, err := synth.Ensure(context.Background(), synth.CacheDir(), preset, seed, shards)
	if err != nil {
		tb.Fatalf("synthetic model %s: %v", preset, err)
	}
	return dir
}

// Sparse returns the directory of preset written sparse in the released
// layout (synth.Options.Sparse: every weight zero, held in holes), writing
// it if needed. The K3 preset is the whole released file set at its real
// size (about 130 MB of headers, index and tokenizer on disk; half a
// minute to write, once per machine).
func Sparse(tb testing.TB, preset string) string {
	tb.Helper()
	cfg, err := configs.ModelPreset(preset)
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(cfg)
	name := fmt.Sprintf("%s-sparse-layout%d-%s", preset, synth.LayoutVersion, hex.EncodeToString(sum[:6]))
	dir, err := synth.Cached(context.Background(), synth.CacheDir(), name, cfg, synth.Options{Sparse: true})
	if err != nil {
		tb.Fatalf("sparse model %s: %v", preset, err)
	}
	return dir
}

// Copy copies the checkpoint in dir (its files; a checkpoint has no
// folders) into a private temporary folder that the test may change, and
// returns that folder.
func Copy(tb testing.TB, dir string) string {
	tb.Helper()
	out := tb.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}
