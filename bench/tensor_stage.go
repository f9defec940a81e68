package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/decode-worker/collective"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

// A tensor stage is the T ranks of one pipeline stage that split every
// layer (model.Shard) and sum their partial outputs with the collective
// over loopback TCP kvtransfer channels, the mesh's transport. The bench
// runs it without the pipeline: every rank runs the same decode steps of
// the same sequences, each rank's token choice the same from the same
// gathered candidates (model.Greedy).

func init() {
	register(command{name: "tensor-rank", short: "one rank of decodegroup --tensor --processes (started by it; not for direct use)", run: runTensorRankCommand})
}

// tensorRankConfig is what one rank of a measured stage runs.
type tensorRankConfig struct {
	Model   string   `json:"model"`
	Cache   string   `json:"cache"`
	Rank    int      `json:"rank"`
	Ranks   int      `json:"ranks"`
	Addrs   []string `json:"addrs"` // each rank's kvtransfer server
	Secret  string   `json:"secret"`
	Seqs    []int    `json:"seqs"`
	Prompt  int      `json:"prompt"`
	Tokens  int      `json:"tokens"`
	Threads int      `json:"threads"`
	Core    int      `json:"core"` // pin the process to this CPU (-1: no)
	// transport carries the rank's channels (nil: TCP); ranks in this
	// process only (the RDMA link's fake wire is in-process).
	transport kvtransfer.Transport
}

// tensorRun is one rank's figures for one number of sequences.
type tensorRun struct {
	Sequences    int     `json:"sequences"`
	Steps        int     `json:"steps"`
	TokS         float64 `json:"tok_s"`
	StepMS       float64 `json:"ms_per_step"`
	CollectiveMS float64 `json:"collective_ms_per_step"`
	Reductions   float64 `json:"reductions_per_step"`
	IDs          []int32 `json:"ids"` // the first sequence's generated ids
}

func runTensorRankCommand(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("tensor-rank", pflag.ContinueOnError)
	conf := fs.String("config", "", "the rank's configuration as JSON (decodegroup writes it)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var cfg tensorRankConfig
	if err := json.Unmarshal([]byte(*conf), &cfg); err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	if cfg.Core >= 0 {
		runtime.GOMAXPROCS(1)
		if err := pinProcess(cfg.Core); errors.Is(err, errNoPin) {
			fmt.Fprintf(os.Stderr, "tensor-rank %d: %v; running with GOMAXPROCS 1 unpinned\n", cfg.Rank, err)
		} else if err != nil {
			return err
		}
	}
	runs, err := runTensorRank(ctx, cfg)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(runs)
}

// runTensorRank loads the rank's shard, connects the stage's collective
// and measures every number of sequences.
func runTensorRank(ctx context.Context, cfg tensorRankConfig) ([]tensorRun, error) {
	sh := model.Shard{Rank: cfg.Rank, Ranks: cfg.Ranks}
	m, err := model.Load(cfg.Model, cpu.New(max(cfg.Threads, 1)), model.LoadOptions{Embed: true, Head: true, Shard: sh})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	if m.State.LatentDType, err = model.ParseCacheDType(cfg.Cache); err != nil {
		return nil, err
	}
	var g *collective.Group
	if sh.Split() {
		if g, err = connectStage(ctx, cfg); err != nil {
			return nil, err
		}
		defer g.Close()
		m.Reduce = g
	}
	var out []tensorRun
	for _, n := range cfg.Seqs {
		r, err := decodeStage(ctx, m.Model, g, n, cfg.Prompt, cfg.Tokens)
		if err != nil {
			return nil, fmt.Errorf("rank %d, %d sequences: %w", cfg.Rank, n, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// connectStage opens the rank's kvtransfer server at its address and the
// collective's channels to the other ranks.
func connectStage(ctx context.Context, cfg tensorRankConfig) (*collective.Group, error) {
	srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: cfg.Addrs[cfg.Rank], Transport: cfg.transport})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	links, err := collective.Connect(cctx, collective.ConnectConfig{Group: "bench", Rank: cfg.Rank, Ranks: cfg.Ranks, Server: srv, Addrs: cfg.Addrs, Secret: []byte(cfg.Secret), Transport: cfg.transport})
	if err != nil {
		srv.Close()
		return nil, err
	}
	return collective.New(collective.Config{Rank: cfg.Rank, Ranks: cfg.Ranks, Links: links})
}

// decodeStage prefills n prompts and times tokens greedy decode steps of
// all n sequences at once (after one untimed step).
func decodeStage(ctx context.Context, m *model.Model, g *collective.Group, n, promptLen, tokens int) (tensorRun, error) {
	seqs := make([]*model.SeqState, n)
	batch := make([][]int32, n)
	for i := range seqs {
		seqs[i] = m.NewState(0, m.Cfg.NumLayers)
		batch[i] = make([]int32, promptLen)
		for j := range batch[i] {
			batch[i][j] = int32((i*7919 + j*104729 + 13) % m.Cfg.VocabSize)
		}
	}
	next, err := stageStep(ctx, m, seqs, batch, model.PhasePrefill)
	if err != nil {
		return tensorRun{}, err
	}
	r := tensorRun{Sequences: n, Steps: tokens}
	var start time.Time
	var before collective.Stats
	for s := -1; s < tokens; s++ {
		if s == 0 {
			start = time.Now()
			if g != nil {
				before = g.Stats()
			}
		}
		for i := range batch {
			batch[i] = []int32{next[i]}
		}
		if next, err = stageStep(ctx, m, seqs, batch, model.PhaseDecode); err != nil {
			return r, err
		}
		if s >= 0 {
			r.IDs = append(r.IDs, next[0])
		}
	}
	el := time.Since(start)
	r.TokS = float64(n*tokens) / el.Seconds()
	r.StepMS = durMS(el) / float64(tokens)
	if g != nil {
		after := g.Stats()
		r.CollectiveMS = durMS(after.Total-before.Total) / float64(tokens)
		r.Reductions = float64(after.Calls-before.Calls) / float64(tokens)
	}
	return r, nil
}

// stageStep runs one step of every sequence through the whole model and
// returns the greedy tokens.
func stageStep(ctx context.Context, m *model.Model, seqs []*model.SeqState, tokens [][]int32, phase model.Phase) ([]int32, error) {
	b, err := m.NewBatch(seqs, tokens)
	if err != nil {
		return nil, err
	}
	defer m.FreeBatch(b)
	if err := m.ForwardLayers(ctx, 0, m.Cfg.NumLayers, b, phase); err != nil {
		return nil, err
	}
	b.Advance()
	return m.Greedy(ctx, b)
}

// errNoPin is returned where a process cannot be pinned to a core.
var errNoPin = errors.New("pinning a process to a core needs linux")
