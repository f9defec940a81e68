package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/internal/progress"
)

const cacheHelp = `The prefix-state caches: each decode group keeps the states of the prompts it
served in its ranks' memory (each rank its layers' share, under entry ids the
group's ranks share), and a prefill worker with prefix_store.dir keeps whole
states on its disk. A prompt that starts with a kept prefix is prefilled from
there. Entries are keyed by a hash chain over 64-token blocks seeded with the
model identity and the cache dtype, so a worker restarted with another model
or dtype never resumes from an old entry (a prefill worker removes such files
when it opens its store).

  coordinator cache list [WORKER...]   every worker's entries (or the named workers')
  coordinator cache drop WORKER KEY    drop one entry (on a decode rank: on every rank of its group)
  coordinator cache drop --all WORKER  drop every entry of a worker (of a decode rank's whole group)
  coordinator cache drop --all         drop every entry of every worker

The list shows, per entry: the worker, its kind and group, the model identity
and cache dtype the entry was keyed with, the entry's key (what drop takes),
its prefix hash (the chain link at its last token; a decode rank other than
the group's head shows the head's), its tokens, the resumable positions
(decode ranks' snapshots), its bytes and when a job last used it.

A job running from an entry keeps running when it is dropped (its state was
copied at admission); the next job with that prefix misses and prefills it
again. A prefill worker's store outlives its restarts: drop it (drop --all
WORKER) after changing a checkpoint's weights in place, since the model
identity covers the config and every tensor's name, dtype and shape, not
the values (a decode rank's cache goes with its process).

Listing and dropping are the operator's: these commands log in as the
coordinator (this machine's coordinator.json when no credentials are
given); the NATS server refuses the cache subjects to workers and clients.
Exit status 1 if a worker does not answer or refuses (what the others said is printed).

`

func cacheCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "list or drop the prefix-state cache entries of the decode ranks and the prefill workers",
		Long:  cacheHelp + "The settings of list and drop:\n\n" + settingsHelp(natsSettings),
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(cacheListCmd(), cacheDropCmd())
	return cmd
}

func cacheListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [WORKER...]",
		Short: "list every worker's prefix-cache entries (or the named workers')",
		Long:  cacheHelp + settingsHelp(natsSettings),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, w := range args {
				if err := cp.CheckID(w); err != nil {
					return fmt.Errorf("worker %q: %w", w, err)
				}
			}
			asJSON, _ := cmd.Flags().GetBool("json")
			return withWorkers(cmd, "tandem-cache", func(ctx context.Context, nc *nats.Conn, ws []cp.WorkerInfo) error {
				targets, err := listTargets(ws, args)
				if err != nil {
					return err
				}
				ask := func(ctx context.Context, w string) (*cp.CacheReply, error) { return cp.ListCache(ctx, nc, w) }
				res := askCaches(ctx, targets, ask)
				// The heads of listed ranks' groups know the prefixes.
				heads := res.Workers
				if extra := headsOf(ws, targets); len(extra) > 0 {
					heads = append(slices.Clone(heads), askCaches(ctx, extra, ask).Workers...)
				}
				fillPrefixes(res.Workers, heads)
				return res.print(cmd, asJSON, printCacheList)
			})
		},
	}
	cmd.Flags().Bool("json", false, "print the listing as one JSON object: {\"workers\": [replies], \"errors\": [...]}")
	addFlags(cmd.Flags(), natsSettings)
	return cmd
}

func cacheDropCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "drop (WORKER KEY | --all [WORKER])",
		Short: "drop one prefix-cache entry, all of a worker's, or all",
		Long:  cacheHelp + settingsHelp(natsSettings),
		Args:  cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			all, _ := cmd.Flags().GetBool("all")
			worker, key, err := dropArgs(args, all)
			if err != nil {
				return err
			}
			asJSON, _ := cmd.Flags().GetBool("json")
			return withWorkers(cmd, "tandem-cache", func(ctx context.Context, nc *nats.Conn, ws []cp.WorkerInfo) error {
				targets, err := dropTargets(ws, worker)
				if err != nil {
					return err
				}
				res := askCaches(ctx, targets, func(ctx context.Context, w string) (*cp.CacheReply, error) {
					return cp.DropCache(ctx, nc, w, key)
				})
				if err := res.print(cmd, asJSON, printCacheDrop); err != nil {
					return err
				}
				if key != "" && res.dropped() == 0 {
					return fmt.Errorf("no entry %q on %s (see `coordinator cache list`)", key, strings.Join(targets, ", "))
				}
				return nil
			})
		},
	}
	cmd.Flags().Bool("all", false, "drop every entry: of WORKER (a decode rank: of its whole group), or of every worker")
	cmd.Flags().Bool("json", false, "print what each worker dropped as one JSON object: {\"workers\": [replies], \"errors\": [...]}")
	addFlags(cmd.Flags(), natsSettings)
	return cmd
}

// dropArgs checks what a drop names: WORKER KEY, or --all with at most a
// worker. A drop must say --all to empty anything whole.
func dropArgs(args []string, all bool) (worker, key string, err error) {
	switch {
	case all && len(args) > 1:
		return "", "", errors.New("--all drops every entry: give at most a worker, not a key")
	case !all && len(args) != 2:
		return "", "", errors.New("name a worker and an entry key (see `coordinator cache list`), or give --all")
	}
	if len(args) > 0 {
		worker = args[0]
		if err := cp.CheckID(worker); err != nil {
			return "", "", fmt.Errorf("worker %q: %w", worker, err)
		}
	}
	if len(args) > 1 {
		key = args[1]
		if err := cp.CheckID(key); err != nil {
			return "", "", fmt.Errorf("cache entry key %q: %w", key, err)
		}
	}
	return worker, key, nil
}

// withWorkers connects as the coordinator (a connection named name), reads
// the registry and runs fn. One bad entry (a client that wrote to the
// bucket, a worker of another version) must not hide every good one: it
// is skipped with a warning.
func withWorkers(cmd *cobra.Command, name string, fn func(context.Context, *nats.Conn, []cp.WorkerInfo) error) error {
	v, err := resolve(cmd, natsSettings)
	if err != nil {
		return err
	}
	nc, err := connect(cmd, v, name, cp.PrincipalCoordinator)
	if err != nil {
		return err
	}
	defer nc.Close()
	ws, skipped, err := listWorkers(cmd.Context(), nc)
	if err != nil {
		return err
	}
	for _, why := range skipped {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s (skipped)\n", why)
	}
	return fn(cmd.Context(), nc, ws)
}

// listTargets are the workers a list asks: the named ones (each must be
// registered), or every registered worker.
func listTargets(ws []cp.WorkerInfo, names []string) ([]string, error) {
	if len(names) == 0 {
		out := make([]string, 0, len(ws))
		for _, w := range ws {
			out = append(out, w.ID)
		}
		slices.Sort(out)
		return out, nil
	}
	for _, n := range names {
		if !slices.ContainsFunc(ws, func(w cp.WorkerInfo) bool { return w.ID == n }) {
			return nil, fmt.Errorf("no worker %q in the registry (see `coordinator workers`)", n)
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(names))), nil
}

// dropTargets are the workers a drop goes to: worker, or every rank of its
// decode group (the group's ranks keep one entry under one id, each its
// layers' share), or every registered worker when worker is empty.
func dropTargets(ws []cp.WorkerInfo, worker string) ([]string, error) {
	if worker == "" {
		return listTargets(ws, nil)
	}
	i := slices.IndexFunc(ws, func(w cp.WorkerInfo) bool { return w.ID == worker })
	if i < 0 {
		return nil, fmt.Errorf("no worker %q in the registry (see `coordinator workers`)", worker)
	}
	if ws[i].Kind != cp.KindDecode {
		return []string{worker}, nil
	}
	var out []string
	for _, w := range ws {
		if w.Kind == cp.KindDecode && w.GroupID == ws[i].GroupID {
			out = append(out, w.ID)
		}
	}
	slices.Sort(out)
	return out, nil
}

// cacheResult is what the asked workers answered, in worker order.
type cacheResult struct {
	Workers []*cp.CacheReply `json:"workers"`
	Errors  []cacheError     `json:"errors,omitempty"`
}

type cacheError struct {
	WorkerID string `json:"worker_id"`
	Error    string `json:"error"`
}

// askCaches sends one request per worker, a few at a time, and gathers
// the answers.
func askCaches(ctx context.Context, workers []string, ask func(context.Context, string) (*cp.CacheReply, error)) *cacheResult {
	reps := make([]*cp.CacheReply, len(workers))
	errs := make([]error, len(workers))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			reps[i], errs[i] = ask(rctx, w)
		}()
	}
	wg.Wait()
	res := &cacheResult{Workers: []*cp.CacheReply{}}
	for i, w := range workers {
		switch err := errs[i]; {
		case errors.Is(err, nats.ErrNoResponders):
			res.Errors = append(res.Errors, cacheError{w, "it serves no cache requests (stopped, or a version without them)"})
		case err != nil:
			res.Errors = append(res.Errors, cacheError{w, err.Error()})
		default:
			res.Workers = append(res.Workers, reps[i])
		}
	}
	return res
}

func (r *cacheResult) dropped() int {
	n := 0
	for _, w := range r.Workers {
		n += w.Dropped
	}
	return n
}

// print writes the result as text (with table) or JSON, the errors to
// stderr, and fails when a worker did not answer or refused.
func (r *cacheResult) print(cmd *cobra.Command, asJSON bool, table func(io.Writer, []*cp.CacheReply, time.Time)) error {
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		table(out, r.Workers, time.Now())
	}
	for _, e := range r.Errors {
		fmt.Fprintf(cmd.ErrOrStderr(), "error: %s: %s\n", e.WorkerID, e.Error)
	}
	if n := len(r.Errors); n > 0 {
		return fmt.Errorf("%d of %d workers failed (see above)", n, n+len(r.Workers))
	}
	return nil
}

// headsOf lists the heads (rank 0) of the decode groups of targets that
// are not among targets.
func headsOf(ws []cp.WorkerInfo, targets []string) []string {
	var out []string
	for _, w := range ws {
		if w.Kind != cp.KindDecode || w.Rank == 0 || !slices.Contains(targets, w.ID) {
			continue
		}
		for _, h := range ws {
			if h.Kind == cp.KindDecode && h.GroupID == w.GroupID && h.Rank == 0 && !slices.Contains(targets, h.ID) && !slices.Contains(out, h.ID) {
				out = append(out, h.ID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// fillPrefixes gives a decode rank's entries the prefix hash its group's
// head (among heads) listed under the same key: only the head keeps the
// tokens.
func fillPrefixes(reps, heads []*cp.CacheReply) {
	byGroup := map[string]map[string]string{} // group -> key -> prefix
	for _, r := range heads {
		if r.Kind == cp.KindDecode && r.Rank == 0 {
			m := map[string]string{}
			for _, e := range r.Entries {
				m[e.Key] = e.Prefix
			}
			byGroup[r.GroupID] = m
		}
	}
	for _, r := range reps {
		if r.Kind != cp.KindDecode || r.Rank == 0 {
			continue
		}
		for i := range r.Entries {
			if e := &r.Entries[i]; e.Prefix == "" {
				e.Prefix = byGroup[r.GroupID][e.Key]
			}
		}
	}
}

func cacheWorker(r *cp.CacheReply) (kind, group string) {
	if r.Kind == cp.KindDecode {
		return "decode", fmt.Sprintf("%s r%d", r.GroupID, r.Rank)
	}
	return string(r.Kind), "-"
}

func printCacheList(w io.Writer, reps []*cp.CacheReply, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tKIND\tGROUP\tMODEL\tDTYPE\tKEY\tPREFIX\tTOKENS\tSNAPSHOTS\tBYTES\tLAST USE")
	for _, r := range reps {
		kind, group := cacheWorker(r)
		row := func(key, prefix, tokens, snaps, bytes, used string) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.WorkerID, kind, group, orDash(r.Model), orDash(r.CacheDType),
				key, prefix, tokens, snaps, bytes, used)
		}
		switch {
		case r.Off:
			row("(cache off)", "-", "-", "-", "-", "-")
		case len(r.Entries) == 0:
			row("(no entries)", "-", "-", "-", "-", "-")
		}
		for _, e := range r.Entries {
			snaps := "-"
			if e.Snapshots > 0 {
				snaps = fmt.Sprint(e.Snapshots)
			}
			row(e.Key, orDash(e.Prefix), fmt.Sprint(e.Tokens), snaps, progress.HumanBytes(e.Bytes),
				client.Duration(now.Sub(e.LastUse).Round(time.Millisecond))+" ago")
		}
		if r.Total > len(r.Entries) {
			row(fmt.Sprintf("(%d more)", r.Total-len(r.Entries)), "-", "-", "-", "-", "-")
		}
	}
	tw.Flush()
}

func printCacheDrop(w io.Writer, reps []*cp.CacheReply, _ time.Time) {
	for _, r := range reps {
		kind, group := cacheWorker(r)
		where := r.WorkerID + " (" + kind
		if group != "-" {
			where += " " + group
		}
		where += ")"
		if r.Off {
			fmt.Fprintf(w, "%s: keeps no cache\n", where)
			continue
		}
		fmt.Fprintf(w, "%s: dropped %d, %d entries (%s) left\n", where, r.Dropped, r.Total, progress.HumanBytes(r.Bytes))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
