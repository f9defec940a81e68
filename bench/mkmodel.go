package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/synth"
)

func init() {
	register(command{name: "mkmodel", short: "write a synthetic K3-shaped checkpoint in the released layout", run: runMkmodel})
}

func runMkmodel(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mkmodel", flag.ContinueOnError)
	preset := fs.String("preset", "tiny", "model preset: "+strings.Join(configs.ModelPresets(), ", "))
	cfgPath := fs.String("config", "", "use this config.json (released nested shape) instead of a preset")
	seed := fs.Uint64("seed", 1, "random seed; the same seed gives the same weights")
	out := fs.String("out", "", "output directory (required)")
	shards := fs.Int("shards", 0, "number of safetensors shards (0: one per layer plus one for the embedding and head, as released)")
	force := fs.Bool("force", false, "overwrite a non-empty output directory")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench mkmodel --preset tiny|small|medium --seed N --out DIR [--shards N] [--force]

Writes a synthetic Kimi K3 checkpoint: config.json in the released nested shape,
released tensor names and dtypes (BF16 trunk, F32 small tensors, MXFP4 routed
experts), safetensors shards and model.safetensors.index.json. Presets: tiny is
K3-SPEC 2.2 (1 MB), small has every structural feature (about 1.4 GB), medium is
larger than 24 GiB of RAM (streaming benchmarks only).

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		fs.Usage()
		return errors.New("--out is required")
	}
	var cfgJSON []byte
	var err error
	if *cfgPath != "" {
		cfgJSON, err = os.ReadFile(*cfgPath)
	} else {
		cfgJSON, err = configs.ModelPreset(*preset)
	}
	if err != nil {
		return err
	}
	cfg, err := model.ParseConfig(cfgJSON)
	if err != nil {
		return err
	}
	var total int64
	for _, t := range synth.Plan(cfg).All() {
		total += t.Bytes()
	}
	fmt.Fprintf(os.Stderr, "mkmodel: %d layers, hidden %d, %d experts, %s of tensors -> %s\n",
		cfg.NumLayers, cfg.HiddenSize, cfg.NumExperts, progress.HumanBytes(total), *out)
	p := progress.NewBytes(os.Stderr, "mkmodel")
	start := time.Now()
	if err := synth.Write(ctx, cfgJSON, *out, synth.Options{Seed: *seed, Shards: *shards, Force: *force, Progress: p.Update}); err != nil {
		return err
	}
	reportTokenizer(cfg.VocabSize)
	fmt.Fprintf(os.Stderr, "mkmodel: done in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}
