package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/layout"
)

func init() {
	register(command{name: "checkpoint", short: "verify a checkpoint directory; list or copy the shards a decode rank needs", run: stages(parseCheckpointFlags, runCheckpoint)})
}

const checkpointUsage = `usage: bench checkpoint verify [--layers A-B | --rank R --ranks N] DIR
       bench checkpoint shards [--layers A-B [--globals] | --rank R --ranks N] [--copy DEST] DIR

verify checks DIR (config.json, model.safetensors.index.json and the shards)
without reading tensor data: every tensor the config implies is in the index
and in the shard the index names, with the dtype and shape the config implies;
every shard exists with the size its header implies. It reads only the shards
the range needs (default: the whole model) and prints each problem as
FILE: [tensor NAME:] what is wrong, expected and found; it exits 1 when any.

shards lists the shard files a part of the model needs: layers A-B (0-based,
inclusive; --globals adds the embedding, final norm and lm_head, which a
decode group's first and last ranks bind), or decode rank R of N with the
layers split evenly as a group file without layer lists splits them. With
--copy DEST it copies them into DEST whole, with config.json, the index and
the tokenizer, and writes every other shard as a header-only stub (its real
header, then a hole: no disk), because every process opens all the shards'
headers but reads only its own layers; DEST/tandem-shards.json names the
stubs, and verify with a range that needs one says so.

`

// checkpointConfig is bench checkpoint's configuration, from its command
// line.
type checkpointConfig struct {
	sub         string // verify or shards
	dir         string
	layers      string
	globals     bool
	rank, ranks int
	dest        string // shards --copy
}

// parseCheckpointFlags parses bench checkpoint's command line: a
// subcommand, its flags and a directory. After --help it returns
// pflag.ErrHelp; on a malformed command line it prints the usage.
func parseCheckpointFlags(args []string) (checkpointConfig, error) {
	var f checkpointConfig
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, checkpointUsage)
		return f, errors.New("want a subcommand: verify or shards")
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(os.Stdout, "%sA flag not given is read from %s (%s for --layers).\n\n%s\n", checkpointUsage,
			config.EnvName("bench-checkpoint-<SUBCOMMAND>", "<FLAG>"), config.EnvName("bench-checkpoint-verify", "layers"), config.BytesHelp())
		return f, pflag.ErrHelp
	}
	f.sub = args[0]
	fs := pflag.NewFlagSet("checkpoint-"+f.sub, pflag.ContinueOnError)
	fs.StringVar(&f.layers, "layers", "", "layers A-B (0-based, inclusive) or a single layer")
	fs.BoolVar(&f.globals, "globals", false, "with --layers: also the model-level tensors (embedding, final norm, lm_head)")
	fs.IntVar(&f.rank, "rank", -1, "decode rank R (with --ranks)")
	fs.IntVar(&f.ranks, "ranks", 0, "the decode group's size, layers split evenly")
	if f.sub == "shards" {
		fs.StringVar(&f.dest, "copy", "", "copy the shards into this directory (stubs for the others)")
	}
	fs.Usage = func() { fmt.Fprint(fs.Output(), checkpointUsage); fs.PrintDefaults() }
	if f.sub != "verify" && f.sub != "shards" {
		fs.Usage()
		return f, fmt.Errorf("unknown subcommand %q: want verify or shards", f.sub)
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return f, err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return f, errors.New("want one checkpoint directory")
	}
	f.dir = fs.Arg(0)
	return f, nil
}

// validate checks the range flags on their own; the range against the
// model is checked once its config is read.
func (f checkpointConfig) validate() error {
	switch {
	case f.layers != "" && f.ranks > 0:
		return errors.New("give --layers or --rank/--ranks, not both")
	case f.layers != "":
		_, err := parseLayers(f.layers)
		return err
	case f.ranks > 0 || f.rank >= 0:
		if f.ranks <= 0 || f.rank < 0 || f.rank >= f.ranks {
			return fmt.Errorf("--rank %d --ranks %d: want 0 <= rank < ranks", f.rank, f.ranks)
		}
	case f.globals:
		return errors.New("--globals goes with --layers")
	}
	return nil
}

// rangeOf is the part of a model of cfg the flags name; nil for the whole
// model.
func (f checkpointConfig) rangeOf(cfg *model.Config) (*layout.Range, error) {
	switch {
	case f.layers != "":
		r, err := parseLayers(f.layers)
		if err != nil {
			return nil, err
		}
		r.Globals = f.globals
		return &r, nil
	case f.ranks > 0:
		split, err := rank.Split(cfg.NumLayers, f.ranks)
		if err != nil {
			return nil, err
		}
		// The first rank embeds, the last projects to the vocabulary.
		return &layout.Range{Lo: split[f.rank][0], Hi: split[f.rank][1], Globals: f.rank == 0 || f.rank == f.ranks-1}, nil
	}
	return nil, nil
}

func runCheckpoint(ctx context.Context, f checkpointConfig) error {
	cfg, _, err := layout.Open(f.dir)
	if err != nil {
		return err
	}
	rg, err := f.rangeOf(cfg)
	if err != nil {
		return err
	}
	if f.sub == "verify" {
		return verifyCheckpoint(f.dir, rg)
	}
	if rg == nil {
		whole := layout.Whole(cfg)
		rg = &whole
	}
	if err := rg.Validate(cfg); err != nil {
		return err
	}
	if f.dest != "" {
		n, err := layout.Copy(ctx, f.dir, f.dest, *rg)
		if err != nil {
			return err
		}
		fmt.Printf("copied %s of %s into %s (%s)\n", rg, f.dir, f.dest, progress.HumanBytes(n))
		return nil
	}
	return listShards(f.dir, *rg)
}

// listShards prints the shards range rg of the checkpoint in dir needs,
// one a line, and their total to stderr.
func listShards(dir string, rg layout.Range) error {
	shards, err := layout.Needed(dir, rg)
	if err != nil {
		return err
	}
	var total int64
	for _, s := range shards {
		size := "missing"
		if s.Size >= 0 {
			size = progress.HumanBytes(s.Size)
			total += s.Size
		}
		fmt.Printf("%s\t%s\t%d tensors\n", s.File, size, s.Tensors)
	}
	fmt.Fprintf(os.Stderr, "%s: %d shards, %s\n", rg, len(shards), progress.HumanBytes(total))
	return nil
}

func verifyCheckpoint(dir string, rg *layout.Range) error {
	rep, err := layout.Verify(dir, rg)
	if err != nil {
		return err
	}
	for _, p := range rep.Problems {
		fmt.Println(p)
	}
	if !rep.OK() {
		return fmt.Errorf("%s: %d problems with %s", dir, len(rep.Problems), rep.Range)
	}
	fmt.Printf("%s: %s verified: %d tensors in %d shards, %s of tensor data (not read)\n", dir, rep.Range, rep.Tensors,
		len(rep.Shards), progress.HumanBytes(rep.Bytes))
	return nil
}

// parseLayers reads "A-B" (inclusive) or "A" into layers [A, B+1).
func parseLayers(s string) (layout.Range, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || lo < 0 || hi < lo {
		return layout.Range{}, fmt.Errorf("--layers %q: want A-B with 0 <= A <= B (0-based, inclusive), or one layer", s)
	}
	return layout.Range{Lo: lo, Hi: hi + 1}, nil
}
