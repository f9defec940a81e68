package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

func init() {
	register(command{name: "logits", short: "write the last prompt position's logits (float32 LE) of a checkpoint", run: runLogits})
	register(command{name: "generate", short: "greedy-generate token ids from a checkpoint", run: runGenerate})
}

// modelFlags are the flags shared by the model tools.
type modelFlags struct {
	dir       string
	ids       string
	threads   int
	latentEps float64
	cache     string
}

func (f *modelFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.dir, "model", "", "checkpoint directory (config.json + safetensors shards) (required)")
	fs.StringVar(&f.ids, "ids", "", "prompt token ids, comma-separated, e.g. 5,17,200 (required)")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads (0: all)")
	fs.Float64Var(&f.latentEps, "latent-norm-eps", 0, "override the MLA latent norm eps (1e-6 published code, 1e-5 vLLM/MLX/C ports)")
	fs.StringVar(&f.cache, "cache-dtype", "bf16", "MLA latent cache dtype: bf16 (the state contract) or f32")
}

func (f *modelFlags) load() (*model.Loaded, []int32, error) {
	if f.dir == "" || f.ids == "" {
		return nil, nil, errors.New("--model and --ids are required")
	}
	ids, err := parseTokenIDs(f.ids)
	if err != nil {
		return nil, nil, err
	}
	dt, err := model.ParseCacheDType(f.cache)
	if err != nil {
		return nil, nil, fmt.Errorf("--cache-dtype: %w", err)
	}
	m, err := model.Load(f.dir, cpu.New(f.threads), model.LoadOptions{Embed: true, Head: true, LatentNormEps: f.latentEps})
	if err != nil {
		return nil, nil, err
	}
	m.State.LatentDType = dt
	for _, id := range ids {
		if id < 0 || int(id) >= m.Cfg.VocabSize {
			m.Close()
			return nil, nil, fmt.Errorf("token id %d is outside the vocabulary [0, %d)", id, m.Cfg.VocabSize)
		}
	}
	return m, ids, nil
}

func parseTokenIDs(s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token id %q is not an integer", f)
		}
		out = append(out, int32(v))
	}
	if len(out) == 0 {
		return nil, errors.New("no token ids given")
	}
	return out, nil
}

func runLogits(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("logits", pflag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	out := fs.String("out", "", "output file: vocab_size little-endian float32 values (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out is required")
	}
	m, ids, err := mf.load()
	if err != nil {
		return err
	}
	defer m.Close()
	_, logits, err := m.Start(ctx, ids)
	if err != nil {
		return err
	}
	b := make([]byte, 4*len(logits))
	for i, v := range logits {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "logits: %d values written to %s (argmax %d)\n", len(logits), *out, model.Argmax(logits))
	return nil
}

func runGenerate(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("generate", pflag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	n := fs.IntP("n", "n", 8, "number of tokens to generate")
	ranks := fs.Int("ranks", 1, "decode group ranks: above 1, a pipeline-parallel group of that many ranks (in process, mesh over loopback TCP) prefills and decodes")
	fs.IntVar(ranks, "pipeline", 1, "pipeline stages (the same as --ranks)")
	tensor := fs.Int("tensor", 1, "tensor ranks per stage: above 1, a decode group of --pipeline stages of this many ranks each (in process, each rank binding only its slices, the stages' collectives and the mesh over loopback TCP) prefills and decodes")
	draftMode := fs.String("draft", "off", "speculative decoding: lookup (a decode group of --ranks drafts from the prompt and output; the ids are the same) or off")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	draft, err := parseDraftMode(*draftMode)
	if err != nil {
		return err
	}
	if *n < 1 {
		return fmt.Errorf("--n must be at least 1, is %d", *n)
	}
	if *ranks < 1 || *tensor < 1 {
		return fmt.Errorf("--ranks (--pipeline) and --tensor must be at least 1, are %d and %d", *ranks, *tensor)
	}
	var gen []int32
	if *ranks > 1 || *tensor > 1 || draft {
		if gen, err = generateGroup(ctx, &mf, *n, *ranks, *tensor, draft); err != nil {
			return err
		}
	} else {
		m, ids, err := mf.load()
		if err != nil {
			return err
		}
		defer m.Close()
		if gen, err = m.Generate(ctx, ids, *n); err != nil {
			return err
		}
	}
	parts := make([]string, len(gen))
	for i, id := range gen {
		parts[i] = strconv.Itoa(int(id))
	}
	fmt.Println(strings.Join(parts, ","))
	return nil
}
