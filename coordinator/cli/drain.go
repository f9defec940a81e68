package cli

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	cp "github.com/tandem-inference/tandem/controlplane"
)

func drainCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "drain WORKER",
		Short: "drain a worker: it takes no new jobs, finishes the running ones, and exits",
		Long: "Ask a worker (a prefill worker or a decode rank, by its id in `coordinator workers`) to drain:\n" +
			"it stops taking jobs at once (the registry shows it draining, so routers pass it by), lets the\n" +
			"jobs it runs finish within its drain.grace (then cancels the rest: those jobs fail, naming the\n" +
			"worker), deregisters and exits. SIGTERM to the worker does the same. A decode group takes no jobs while\n" +
			"any of its ranks drains. Draining is the operator's: this command logs in as the coordinator\n" +
			"(this machine's coordinator.json when no credentials are given).\n\n" + settingsHelp(natsSettings),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			worker := args[0]
			if err := cp.CheckID(worker); err != nil {
				return fmt.Errorf("worker %q: %w", worker, err)
			}
			v, err := resolve(cmd, natsSettings)
			if err != nil {
				return err
			}
			reason, _ := cmd.Flags().GetString("reason")
			nc, err := connect(cmd, v, "tandem-drain", cp.PrincipalCoordinator)
			if err != nil {
				return err
			}
			defer nc.Close()
			rep, err := cp.Drain(cmd.Context(), nc, worker, reason)
			if errors.Is(err, nats.ErrNoResponders) {
				return fmt.Errorf("drain %s: no such worker is connected (see `coordinator workers`): %w", worker, err)
			}
			if err != nil {
				return fmt.Errorf("drain %s: %w", worker, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is draining: %d jobs still running; it exits when they end\n", rep.WorkerID, rep.Running)
			return nil
		},
	}
	cmd.Flags().String("reason", "", "why (the worker logs it)")
	addFlags(cmd.Flags(), natsSettings)
	return cmd
}
