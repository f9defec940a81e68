package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
)

func jobsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "list jobs: queued, running and recently finished, newest first",
		Long:  "List this client's jobs with each one's latest state.\n\n" + settingsHelp(natsSettings),
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := resolve(cmd, natsSettings)
			if err != nil {
				return err
			}
			state, _ := cmd.Flags().GetString("state")
			limit, _ := cmd.Flags().GetInt("limit")
			req := &cp.ListJobsRequest{State: cp.JobState(state), Limit: limit}
			if err := req.Validate(); err != nil {
				return err
			}
			nc, err := connect(cmd, v, "tandem-jobs", cp.PrincipalClient)
			if err != nil {
				return err
			}
			defer nc.Close()
			rep, err := cp.ListJobs(cmd.Context(), nc, req)
			if err != nil {
				return err
			}
			printJobs(cmd.OutOrStdout(), rep.Jobs, time.Now())
			return nil
		},
	}
	cmd.Flags().String("state", "", "only jobs in this state (queued, routed, prefilling, transferring, decoding, done, failed, cancelled)")
	cmd.Flags().Int("limit", 50, "at most this many jobs")
	addFlags(cmd.Flags(), natsSettings)
	return cmd
}

func printJobs(w io.Writer, jobs []cp.JobEvent, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATE\tAGE\tROUTE\tTTFT\tTOKENS\tDETAIL")
	for _, j := range jobs {
		route, ttft, tokens := "-", "-", "-"
		if j.Route != nil {
			route = string(j.Route.Target)
			if j.Route.PrefillWorker != "" {
				route += " (" + j.Route.PrefillWorker + ")"
			}
		}
		if t := j.Timing; t != nil {
			if t.FirstToken > 0 {
				ttft = client.Duration(t.FirstToken)
			}
			tokens = fmt.Sprintf("%d+%d", t.PromptTokens, t.OutputTokens)
		}
		detail := j.Detail
		if j.Error != nil {
			detail = j.Error.Error()
		}
		if j.Progress != nil {
			detail = fmt.Sprintf("layer %d/%d %s", j.Progress.Done, j.Progress.Total, detail)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.JobID, j.State, client.Duration(now.Sub(j.Submitted).Round(time.Second)),
			route, ttft, tokens, oneLine(detail, 100))
	}
	tw.Flush()
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n-3] + "..."
	}
	return s
}

func workersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "list the registered workers: kind, model identity, group and layers, load, memory and measured rates",
		Long: "List the workers in the registry (the heartbeats in the " + cp.WorkersBucket + " bucket). The registry is\n" +
			"the operator's: this command logs in as the coordinator (this machine's coordinator.json\nwhen no credentials are given).\n\n" +
			settingsHelp(natsSettings),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withWorkers(cmd, "tandem-workers", func(_ context.Context, _ *nats.Conn, ws []cp.WorkerInfo) error {
				printWorkers(cmd.OutOrStdout(), ws, time.Now())
				return nil
			})
		},
	}
	addFlags(cmd.Flags(), natsSettings)
	return cmd
}

// listWorkers reads the registry bucket as it is (without changing its
// configuration, which is the coordinator's). Entries that are not valid
// heartbeats are left out and described in skipped.
func listWorkers(ctx context.Context, nc *nats.Conn) (ws []cp.WorkerInfo, skipped []string, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, cp.WorkersBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil, fmt.Errorf("no worker registry (bucket %s): no coordinator has run on this NATS yet", cp.WorkersBucket)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("worker registry: %w", err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("worker registry: %w", err)
	}
	var out []cp.WorkerInfo
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // expired or left meanwhile
		}
		var w cp.WorkerInfo
		if err := cp.Unmarshal(cp.MsgPack, e.Value(), &w); err != nil {
			skipped = append(skipped, fmt.Sprintf("worker registry: key %q is not a worker heartbeat: %v", k, err))
			continue
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	sort.Strings(skipped)
	return out, skipped, nil
}

func printWorkers(w io.Writer, ws []cp.WorkerInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tKIND\tMODEL\tGROUP\tLAYERS\tBACKEND\tACTIVE\tQUEUE\tMEMORY FREE\tMAX SEQ\tRATES\tBEAT\tSTATE")
	for _, x := range ws {
		group, layers := "-", "-"
		if x.Kind == cp.KindDecode {
			group = fmt.Sprintf("%s r%d/%d", x.GroupID, x.Rank, x.GroupSize)
			layers = x.Layers.String()
		}
		mem := "-"
		if x.MemoryTotal > 0 {
			mem = fmt.Sprintf("%.1f/%.1f GiB", float64(x.MemoryFree)/(1<<30), float64(x.MemoryTotal)/(1<<30))
		}
		maxSeq := "-"
		if x.MaxSeqTokens > 0 {
			maxSeq = fmt.Sprint(x.MaxSeqTokens)
		}
		var rates []string
		if r := x.Rates; r.PrefillTokensPerSec > 0 {
			rates = append(rates, fmt.Sprintf("prefill %.0f tok/s", r.PrefillTokensPerSec))
		}
		if r := x.Rates; r.DecodeTokensPerSec > 0 {
			rates = append(rates, fmt.Sprintf("step %.0f/s", r.DecodeTokensPerSec))
		}
		if r := x.Rates; r.PassFloor > 0 {
			floor := "pass floor " + client.Duration(r.PassFloor)
			if r.ReadBytesPerSec > 0 {
				floor += fmt.Sprintf(" (reads %.2f GB/s)", r.ReadBytesPerSec/1e9)
			}
			rates = append(rates, floor)
		}
		if t := x.Rates.Compute; t != nil {
			rates = append(rates, fmt.Sprintf("fitted %s (%d samples, worst %.0f%%)", t.Compute(), t.Samples, 100*t.WorstError))
		}
		state := "ready"
		if x.Draining {
			state = "not taking jobs"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s ago\t%s\n", x.ID, x.Kind, x.Model, group, layers, x.Backend,
			x.Active, x.QueueDepth, mem, maxSeq, strings.Join(rates, ", "), client.Duration(now.Sub(x.Time).Round(time.Millisecond)), state)
	}
	tw.Flush()
}

func cancelCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cancel JOB",
		Short: "cancel a job: every worker involved drops it and frees its memory",
		Long:  "Cancel a job of this client, queued or running.\n\n" + settingsHelp(natsSettings),
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := resolve(cmd, natsSettings)
			if err != nil {
				return err
			}
			reason, _ := cmd.Flags().GetString("reason")
			nc, err := connect(cmd, v, "tandem-cancel", cp.PrincipalClient)
			if err != nil {
				return err
			}
			defer nc.Close()
			rep, err := cp.Cancel(cmd.Context(), nc, args[0], reason)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "job %s %s\n", rep.JobID, rep.State)
			return nil
		},
	}
	cmd.Flags().String("reason", "", "why (kept in the job's events)")
	addFlags(cmd.Flags(), natsSettings)
	return cmd
}
