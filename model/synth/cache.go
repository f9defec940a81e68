package synth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tandem-inference/tandem/configs"
)

// CacheDir is the shared cache of generated checkpoints that the tests and
// the benchmarks use, so that a benchmark serves the model a test or a
// calibration already wrote: $TANDEM_TEST_CACHE (set by scripts/test.sh),
// else a folder in the OS temp dir.
func CacheDir() string {
	if d := os.Getenv("TANDEM_TEST_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "tandem-test-models")
}

// Ensure returns the folder under cacheDir holding the checkpoint of the
// model preset (configs.ModelPreset) for seed and shards, generating it
// unless an identical one is there: the folder's name carries the
// generator's Version and a hash of the config.
func Ensure(ctx context.Context, cacheDir, preset string, seed uint64, shards int) (string, error) {
	cfg, err := configs.ModelPreset(preset)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(cfg)
	name := fmt.Sprintf("%s-seed%d-shards%d-v%d-%s", preset, seed, shards, Version, hex.EncodeToString(sum[:6]))
	return Cached(ctx, cacheDir, name, cfg, Options{Seed: seed, Shards: shards})
}

// Cached returns cacheDir/name, writing the checkpoint of configJSON there
// with opt unless the folder exists; name must identify everything that
// decides the files. Concurrent callers (test packages run in parallel)
// each write into a private folder and rename it into place; the first
// rename wins.
func Cached(ctx context.Context, cacheDir, name string, configJSON []byte, opt Options) (string, error) {
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
	opt.Force = true // tmp exists, empty
	if err := Write(ctx, configJSON, tmp, opt); err != nil {
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
