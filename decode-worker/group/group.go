// Package group starts a whole decode group in one process, each rank with
// its own kvtransfer server on loopback and the mesh between them over real
// TCP, for tests, the bench and demos. A rank can be stopped and started
// again to exercise failures.
package group

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Options configure an in-process group.
type Options struct {
	ModelDir string
	Ranks    int
	// Tensor is the ranks per pipeline stage (rank.Layout; 0 or 1: a
	// plain pipeline); Ranks must be a multiple of it.
	Tensor int
	// Group names it (default "local").
	Group string
	// Threads per rank's CPU backend (0: GOMAXPROCS).
	Threads int
	// LatentDType of the MLA cache (default BF16); LatentNormEps overrides
	// the config's MLA latent norm eps when positive.
	LatentDType   model.DType
	LatentNormEps float64
	// MemoryBudget per rank (0: unlimited).
	MemoryBudget int64
	// Pipeline tuning (pipeline.Config; zero values take its defaults).
	MicroBatches, MaxBatch, PrefillChunk int
	Heartbeat, Idle                      time.Duration
	Timeouts                             kvtransfer.Timeouts
	// PrefixCache configures every rank's prefix-state cache.
	PrefixCache pipeline.PrefixCacheConfig
	// Draft sets up speculative decoding (pipeline.DraftConfig).
	Draft pipeline.DraftConfig
	// Secret of the mesh (default: random).
	Secret []byte
	Log    *zap.Logger
	// Transport, when set, gives rank r's transport: its server listens
	// and its mesh link dials with it (default TCP).
	Transport func(r int) kvtransfer.Transport
}

// transport is rank r's transport (nil: kvtransfer's default, TCP).
func (g *Group) transport(r int) kvtransfer.Transport {
	if g.opt.Transport == nil {
		return nil
	}
	return g.opt.Transport(r)
}

// Group is a running in-process decode group.
type Group struct {
	Layout *rank.Layout
	opt    Options

	mu    sync.Mutex
	ranks []*member
	vocab *grammar.Vocabulary // the model directory's tokenizer's, if it has one
}

// member is one rank's resources.
type member struct {
	m   *model.Loaded
	srv *kvtransfer.Server
	w   *pipeline.Worker
}

// Start loads every rank's shard, listens on loopback ports and starts the
// workers; it returns once the ring is formed or ctx ends.
func Start(ctx context.Context, opt Options) (*Group, error) {
	if opt.Ranks < 1 {
		return nil, fmt.Errorf("group: %d ranks", opt.Ranks)
	}
	if opt.Group == "" {
		opt.Group = "local"
	}
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	if opt.Secret == nil {
		opt.Secret = make([]byte, 32)
		_, _ = rand.Read(opt.Secret) // crypto/rand.Read never fails
	}
	cfg, err := model.LoadConfig(opt.ModelDir + "/config.json")
	if err != nil {
		return nil, err
	}
	g := &Group{opt: opt, ranks: make([]*member, opt.Ranks)}
	if _, err := os.Stat(filepath.Join(opt.ModelDir, tokenizer.ModelFile)); err == nil {
		tok, err := tokenizer.Load(opt.ModelDir)
		if err != nil {
			return nil, fmt.Errorf("group: %w", err)
		}
		if g.vocab, err = tok.GrammarVocabulary(); err != nil {
			return nil, fmt.Errorf("group: %w", err)
		}
	}
	var eps []string
	for r := range g.ranks {
		srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: "127.0.0.1:0", Timeouts: opt.Timeouts, Transport: g.transport(r)})
		if err != nil {
			g.Close()
			return nil, err
		}
		g.ranks[r] = &member{srv: srv}
		eps = append(eps, srv.Addr())
	}
	if g.Layout, err = rank.EvenTensor(opt.Group, cfg.NumLayers, eps, max(opt.Tensor, 1)); err != nil {
		g.Close()
		return nil, err
	}
	for r := range g.ranks {
		if err := g.startRank(r, nil); err != nil {
			g.Close()
			return nil, err
		}
	}
	if err := g.Head().WaitReady(ctx); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// startRank loads rank r's shard (if needed) and starts its worker on its
// server (listening again on its endpoint if it was stopped), its
// configuration changed by change when not nil.
func (g *Group) startRank(r int, change func(*pipeline.Config)) error {
	mb := g.ranks[r]
	if mb.srv == nil {
		srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: g.Layout.Ranks[r].Endpoint, Timeouts: g.opt.Timeouts, Transport: g.transport(r)})
		if err != nil {
			return fmt.Errorf("group: rank %d: %w", r, err)
		}
		mb.srv = srv
	}
	if mb.m == nil {
		m, err := rank.LoadShard(g.opt.ModelDir, cpu.New(g.opt.Threads), g.Layout, r, g.opt.LatentNormEps)
		if err != nil {
			return err
		}
		if m.PinErr != nil {
			g.opt.Log.Warn(rank.PinRefused, zap.Int("rank", r), zap.Error(m.PinErr))
		}
		if g.opt.LatentDType != 0 {
			m.State.LatentDType = g.opt.LatentDType
		}
		mb.m = m
	}
	cfg := pipeline.Config{Rank: r, Layout: g.Layout, Model: mb.m.Model, Server: mb.srv, Secret: g.opt.Secret,
		Timeouts: g.opt.Timeouts, MemoryBudget: g.opt.MemoryBudget, MicroBatches: g.opt.MicroBatches, MaxBatch: g.opt.MaxBatch,
		PrefillChunk: g.opt.PrefillChunk, Heartbeat: g.opt.Heartbeat, Idle: g.opt.Idle, PrefixCache: g.opt.PrefixCache, Draft: g.opt.Draft, Log: g.opt.Log,
		Transport: g.transport(r)}
	if g.Layout.HoldsHead(r) {
		cfg.Vocabulary = g.vocab // every rank of the last stage draws
	}
	if change != nil {
		change(&cfg)
	}
	w, err := pipeline.Start(cfg)
	if err != nil {
		return err
	}
	mb.w = w
	return nil
}

// Head is rank 0's worker, the group's front door.
func (g *Group) Head() *pipeline.Worker { return g.Worker(0) }

// Worker returns rank r's worker (nil while it is stopped).
func (g *Group) Worker(r int) *pipeline.Worker {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ranks[r].w
}

// Server returns rank r's kvtransfer server (nil while it is stopped).
func (g *Group) Server(r int) *kvtransfer.Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ranks[r].srv
}

// Model returns rank r's resident shard.
func (g *Group) Model(r int) *model.Model {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ranks[r].m.Model
}

// Stop stops rank r as a crash would look to its peers: its connections
// close with no goodbye. Its weights stay loaded for Restart.
func (g *Group) Stop(r int) {
	g.mu.Lock()
	mb := g.ranks[r]
	w, srv := mb.w, mb.srv
	mb.w, mb.srv = nil, nil
	g.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	if w != nil {
		w.Close()
	}
}

// Restart starts a stopped rank again on its endpoint.
func (g *Group) Restart(r int) error { return g.RestartWith(r, nil) }

// RestartWith starts a stopped rank again on its endpoint with its
// configuration changed by change, as a process restarted with other
// settings (another model identity, another cache dtype: change may set
// cfg.Model.State, which stays with the rank's loaded shard).
func (g *Group) RestartWith(r int, change func(*pipeline.Config)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ranks[r].w != nil {
		return fmt.Errorf("group: rank %d is running", r)
	}
	return g.startRank(r, change)
}

// Close stops every rank and unmaps the weights.
func (g *Group) Close() error {
	var errs []error
	for r, mb := range g.ranks {
		if mb == nil {
			continue
		}
		g.Stop(r)
		if mb.m != nil {
			errs = append(errs, mb.m.Close())
			mb.m = nil
		}
	}
	return errors.Join(errs...)
}

// Generate runs one locally prefilled sequence with greedy sampling and
// returns its n tokens, like model.Generate.
func (g *Group) Generate(ctx context.Context, id string, prompt []int32, n int) ([]int32, error) {
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: id, Tokens: prompt, MaxTokens: n, Sink: c}); err != nil {
		return nil, err
	}
	toks, res, err := c.Wait(ctx, id)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return toks, res.Err
	}
	return toks, nil
}
