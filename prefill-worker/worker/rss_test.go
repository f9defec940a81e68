package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/prefill-worker/rss"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// RSSOverhead is the memory a worker process may use beyond its budget:
// the Go runtime, binary, goroutine stacks and allocator slack, which the
// planner does not count.
const RSSOverhead = 64 << 20

const rssChildEnv = "TANDEM_PREFILL_RSS_CHILD"

var rssPrompts = [][]int32{testkit.Prompt(21, 8192, 1), testkit.Prompt(9, 8192, 2), testkit.Prompt(14, 8192, 3)}

// TestPeakRSSWithinBudget runs the worker on the small preset (1.4 GB of
// weights) in a child process under budgets far below the model size, with
// the Go memory limit set to the budget as the binary does, and checks the
// child's peak RSS (measured by the child itself) against budget +
// RSSOverhead and its states against the model core.
func TestPeakRSSWithinBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("small model: ~10 s per budget")
	}
	dir := testmodel.Dir(t, "small", 1, 0)
	want := references(t, dir, rssPrompts)
	for _, budget := range []int64{512 << 20, 256 << 20} {
		out := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), rssChildEnv+"=1", "RSS_MODEL="+dir, "RSS_OUT="+out, "RSS_BUDGET="+strconv.FormatInt(budget, 10))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("budget %s: child: %v\n%s", progress.HumanBytes(budget), err, stderr.String())
		}
		peak, err := strconv.ParseInt(strings.TrimSpace(stdout.String()), 10, 64)
		if err != nil {
			t.Skipf("the child could not measure its peak RSS: %q", stdout.String())
		}
		t.Logf("budget %s: peak RSS %s (%.0f%% of budget); %s", progress.HumanBytes(budget), progress.HumanBytes(peak),
			100*float64(peak)/float64(budget), strings.TrimSpace(stderr.String()))
		if peak > budget+RSSOverhead {
			t.Errorf("budget %s: peak RSS %s exceeds budget + %s overhead", progress.HumanBytes(budget), progress.HumanBytes(peak), progress.HumanBytes(RSSOverhead))
		}
		for i := range rssPrompts {
			got, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("p%d.k3st", i)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want[i]) {
				t.Fatalf("budget %s: prompt %d: state differs from the model core's prefill", progress.HumanBytes(budget), i)
			}
		}
	}
}

// rssChild is the child's side: a worker under the budget writing states to
// files, as the standalone binary does.
func rssChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	budget, err := strconv.ParseInt(os.Getenv("RSS_BUDGET"), 10, 64)
	if err != nil {
		fail(err)
	}
	debug.SetMemoryLimit(budget)
	w, err := worker.New(worker.Config{Model: os.Getenv("RSS_MODEL"), Budget: budget, Depth: -1})
	if err != nil {
		fail(err)
	}
	var jobs []*worker.Job
	for i, p := range rssPrompts {
		f, err := sink.NewFile(filepath.Join(os.Getenv("RSS_OUT"), fmt.Sprintf("p%d.k3st", i)), w.Model().NumLayers)
		if err != nil {
			fail(err)
		}
		j, err := w.Submit(worker.Spec{ID: fmt.Sprintf("p%d", i), Tokens: p[:len(p)-1], Sink: f})
		if err != nil {
			fail(err)
		}
		jobs = append(jobs, j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, j := range jobs {
		if err := j.Wait(ctx); err != nil {
			fail(err)
		}
	}
	st := w.Stats()
	if err := w.Close(); err != nil {
		fail(err)
	}
	lp := st.LastPass
	fmt.Fprintf(os.Stderr, "%d passes, depth %d, plan: %s", st.Passes, w.Depth(), lp.Plan)
	if peak, err := rss.Peak(); err == nil {
		fmt.Println(peak)
	}
}
