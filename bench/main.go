// Command bench holds tandem's model tools (mkmodel, logits, generate, checkpoint,
// tokenize) and its benchmarks (stream, transfer, e2e, sim, calibrate,
// validate).
// Each subcommand lives in its own file and registers itself in init.
// Flags are pflag's (--name value); each flag not given may come from
// TANDEM_BENCH_<COMMAND>_<FLAG> (package internal/config).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/internal/config"
)

// command is one bench subcommand.
type command struct {
	name  string
	short string
	run   func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

// configurable is a command's configuration, checked before it runs.
type configurable interface {
	validate() error
}

// stages makes a command's run function from its three parts: parse the
// flags (pflag.ErrHelp after --help, which main takes as success), validate
// the configuration, then run it.
func stages[C configurable](parse func(args []string) (C, error), run func(ctx context.Context, c C) error) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		c, err := parse(args)
		if err != nil {
			return err
		}
		if err := c.validate(); err != nil {
			return err
		}
		return run(ctx, c)
	}
}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("bench: duplicate command " + c.name)
	}
	commands[c.name] = c
}

// parseFlags parses a subcommand's flags (fs is named after it): the
// command line, then TANDEM_BENCH_<COMMAND>_<FLAG> for flags not given.
// --help prints the command's usage to stdout and returns pflag.ErrHelp,
// which main takes as success.
func parseFlags(fs *pflag.FlagSet, args []string) error {
	process := "bench-" + fs.Name()
	own := fs.Usage
	fs.Usage = func() {
		w := fs.Output()
		if own != nil {
			own()
		} else {
			fmt.Fprintf(w, "usage: bench %s [flags]\n\n%s.\n\nFlags:\n", fs.Name(), commands[fs.Name()].short)
			fs.PrintDefaults()
		}
		fmt.Fprintf(w, "\nA flag not given is read from %s (%s for --%s).\n\n%s\n",
			config.EnvName(process, "<FLAG>"), config.EnvName(process, firstFlag(fs)), firstFlag(fs), config.BytesHelp())
	}
	return config.ParseArgs(fs, process, args, os.Stdout, os.Stderr)
}

// firstFlag is the name of fs's first flag in sorted order, for examples.
func firstFlag(fs *pflag.FlagSet) string {
	first := ""
	fs.VisitAll(func(f *pflag.Flag) {
		if first == "" && !f.Hidden {
			first = f.Name
		}
	})
	return first
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: bench <command> [flags]\n\nModel tools and benchmarks for tandem. Commands:\n\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, commands[n].short)
	}
	fmt.Fprintf(w, "\nRun 'bench <command> --help' for a command's flags. A flag not given is read from\n"+
		"the environment variable TANDEM_BENCH_<COMMAND>_<FLAG>, upper-cased with dashes as\n"+
		"underscores (TANDEM_BENCH_STREAM_MEMORY_BUDGET=4GiB).\n\n%s\n", config.BytesHelp())
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	if os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(os.Stdout)
		return
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench: unknown command %q\n\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.run(ctx, os.Args[2:]); err != nil && !errors.Is(err, pflag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", c.name, err)
		os.Exit(1)
	}
}
