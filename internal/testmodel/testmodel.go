// Package testmodel provides synthetic checkpoints to tests, generated once
// per machine into a cache directory and shared by every test package.
package testmodel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model/synth"
)

// CacheDir is where generated test models live: $TANDEM_TEST_CACHE, or a
// folder in the OS temp dir.
func CacheDir() string {
	if d := os.Getenv("TANDEM_TEST_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "tandem-test-models")
}

// Dir returns the directory of preset generated with seed into the given
// number of shards, generating it if needed.
func Dir(tb testing.TB, preset string, seed uint64, shards int) string {
	tb.Helper()
	dir, err := Ensure(context.Background(), CacheDir(), preset, seed, shards)
	if err != nil {
		tb.Fatalf("synthetic model %s: %v", preset, err)
	}
	return dir
}

// Ensure generates the model into cacheDir unless an identical one is there.
// Concurrent callers (test packages run in parallel) each generate into a
// private folder and rename it into place; the first rename wins.
func Ensure(ctx context.Context, cacheDir, preset string, seed uint64, shards int) (string, error) {
	cfg, err := configs.ModelPreset(preset)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(cfg)
	name := fmt.Sprintf("%s-seed%d-shards%d-v%d-%s", preset, seed, shards, synth.Version, hex.EncodeToString(sum[:6]))
	return ensure(ctx, cacheDir, name, cfg, synth.Options{Seed: seed, Shards: shards, Force: true})
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
	dir, err := ensure(context.Background(), CacheDir(), name, cfg, synth.Options{Sparse: true, Force: true})
	if err != nil {
		tb.Fatalf("sparse model %s: %v", preset, err)
	}
	return dir
}

func ensure(ctx context.Context, cacheDir, name string, cfg []byte, opt synth.Options) (string, error) {
	dir := filepath.Join(cacheDir, name)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, name+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := synth.Write(ctx, cfg, tmp, opt); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "config.json")); statErr == nil {
			return dir, nil // another process won the race
		}
		return "", errors.Join(fmt.Errorf("install %s", dir), err)
	}
	return dir, nil
}
