package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/internal/diskfree"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/synth"
)

func init() {
	register(command{name: "mkmodel", short: "write a synthetic K3-shaped checkpoint in the released layout", run: stages(parseMkmodelFlags, runMkmodel)})
}

// mkmodelConfig is bench mkmodel's configuration, from its flags.
type mkmodelConfig struct {
	preset, config, out string
	seed                uint64
	shards              int
	force, sparse       bool
}

// parseMkmodelFlags parses bench mkmodel's command line. After --help it
// returns pflag.ErrHelp; without --out it prints the usage.
func parseMkmodelFlags(args []string) (mkmodelConfig, error) {
	var f mkmodelConfig
	fs := pflag.NewFlagSet("mkmodel", pflag.ContinueOnError)
	fs.StringVar(&f.preset, "preset", "tiny", "model preset: "+strings.Join(configs.ModelPresets(), ", "))
	fs.StringVar(&f.config, "config", "", "use this config.json (released nested shape) instead of a preset")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed; the same seed gives the same weights")
	fs.StringVar(&f.out, "out", "", "output directory (required)")
	fs.IntVar(&f.shards, "shards", 0, "number of safetensors shards (0: as released: one per layer, one for the embedding and head, the vision projector's and tower's)")
	fs.BoolVar(&f.force, "force", false, "overwrite a non-empty output directory")
	fs.BoolVar(&f.sparse, "sparse", false, "leave every tensor's data as a hole that reads as zeros: full-size files that take no disk")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench mkmodel --preset tiny|small|medium|k3 --seed N --out DIR [--shards N] [--force] [--sparse]

Writes a synthetic Kimi K3 checkpoint: config.json in the released nested shape,
released tensor names and dtypes (BF16 trunk, F32 small tensors, MXFP4 routed
experts), safetensors shards and model.safetensors.index.json, and the vision
tower and projector of the config's vision_config under the released names in
the last two shards (tiny, small and demo have a small tower of K3's structure:
width 64, 2 blocks of 2 heads of 32; medium and k3 have K3's). Presets: tiny is
K3-SPEC 2.2 (1 MB), small has every structural feature (about 1.4 GB), medium is
larger than 24 GiB of RAM (streaming benchmarks only), k3 is Kimi K3 at its
released size (1.56 TB: use it with --sparse, which writes the released 96
files, headers and sizes with zero weights held in holes, so that the whole
model can be planned and streamed on a machine that cannot store it).

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	if f.out == "" {
		fs.Usage()
		return f, errors.New("--out is required")
	}
	return f, nil
}

// validate checks the flags that need no file: the preset, when no
// --config is given.
func (f mkmodelConfig) validate() error {
	if f.config == "" {
		if _, err := configs.ModelPreset(f.preset); err != nil {
			return fmt.Errorf("--preset: %w", err)
		}
	}
	return nil
}

// configJSON is the model's config.json: --config's file or the preset's.
func (f mkmodelConfig) configJSON() ([]byte, error) {
	if f.config != "" {
		return os.ReadFile(f.config)
	}
	return configs.ModelPreset(f.preset)
}

func runMkmodel(ctx context.Context, f mkmodelConfig) error {
	cfgJSON, err := f.configJSON()
	if err != nil {
		return err
	}
	cfg, err := model.ParseConfig(cfgJSON)
	if err != nil {
		return err
	}
	var total, visionBytes int64
	for _, t := range synth.Plan(cfg).All() {
		total += t.Bytes()
	}
	projector, tower, err := synth.VisionPlan(cfg)
	if err != nil {
		return err
	}
	for _, t := range append(projector, tower...) {
		visionBytes += t.Bytes()
	}
	kind := ""
	if f.sparse {
		kind = " (sparse: zero weights in holes)"
	}
	fmt.Fprintf(os.Stderr, "mkmodel: %d layers, hidden %d, %d experts, %s of text tensors, %s of vision tower and projector%s -> %s\n",
		cfg.NumLayers, cfg.HiddenSize, cfg.NumExperts, progress.HumanBytes(total), progress.HumanBytes(visionBytes), kind, f.out)
	p := progress.NewBytes(os.Stderr, "mkmodel")
	start := time.Now()
	if err := synth.Write(ctx, cfgJSON, f.out, synth.Options{Seed: f.seed, Shards: f.shards, Force: f.force, Sparse: f.sparse, Progress: p.Update}); err != nil {
		return err
	}
	reportTokenizer(cfg.VocabSize)
	if size, used, ok := dirUsage(f.out); ok {
		fmt.Fprintf(os.Stderr, "mkmodel: %s in files, %s on disk\n", progress.HumanBytes(size), progress.HumanBytes(used))
	}
	fmt.Fprintf(os.Stderr, "mkmodel: done in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// dirUsage sums the sizes of the files in dir and the disk their blocks
// take (du); ok is false where the platform cannot tell the latter.
func dirUsage(dir string) (size, used int64, ok bool) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, false
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		u, ok := diskfree.Allocated(filepath.Join(dir, e.Name()))
		if !ok {
			return 0, 0, false
		}
		size += fi.Size()
		used += u
	}
	return size, used, true
}
