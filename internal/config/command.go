package config

import (
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// WorkerCommand is a worker binary's root command: the settings as flags
// after --config, arguments refused by resolve (which names them), and run
// given the resolved configuration. Both workers share it so their command
// lines cannot drift apart.
func WorkerCommand[C any](use, short, long string, stdout, stderr io.Writer,
	resolve func(*pflag.FlagSet, []string) (C, error), run func(*cobra.Command, C) error, sets ...[]Setting) *cobra.Command {
	cmd := &cobra.Command{
		Use:           use,
		Short:         short,
		Long:          long,
		Args:          cobra.ArbitraryArgs, // refused by resolve, naming them
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := resolve(cmd.Flags(), args)
			if err != nil {
				return err
			}
			return run(cmd, cfg)
		},
	}
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.Flags().SortFlags = false
	cmd.Flags().String("config", "", "config file (YAML, JSON or TOML) with any of the keys of these flags (dots nest)")
	AddFlags(cmd.Flags(), sets...)
	return cmd
}
