package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tandem-inference/tandem/decode-worker/collective"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/model"
)

// With --group-config and --rank, rdma-probe works on the links rank R of
// the group uses: the pipeline ring's (rank R-1 and R+1, the last rank and
// rank 0 closing it) and, with tensor > 1, its stage's collective links (to
// every other rank of the stage up to collective.DirectMax ranks, to the
// stage's ring neighbours above). A rank answers probes where its worker
// takes RDMA link bootstraps, its endpoint's port + 1 (slot size i on
// port + 1 + i), so the probe measures the device and path the worker
// will use, and must run while the worker does not.

// Link roles.
const (
	roleRingNext   = "ring next"
	roleRingPrev   = "ring previous"
	roleCollective = "collective"
)

// groupInfo is the layout a probe works on.
type groupInfo struct {
	Name    string `json:"name"`
	File    string `json:"file"`
	Ranks   int    `json:"ranks"`
	Stages  int    `json:"pipeline"`
	Tensor  int    `json:"tensor"`
	Rank    int    `json:"rank"`
	Stage   int    `json:"stage"`
	TRank   int    `json:"tensor_rank"`
	Address string `json:"probe_address"` // where this rank answers (--answer)
	// Answer and Measure measure every link of the rank: Answer on each
	// rank (P standing for its rank), then Measure on this one.
	Answer  string `json:"answer_command"`
	Measure string `json:"measure_command"`
}

// probeLink is one link of the rank: the peer, why the rank needs it, and
// what was measured over it.
type probeLink struct {
	Peer     int      `json:"peer"`
	Stage    int      `json:"stage"`
	TRank    int      `json:"tensor_rank"`
	Roles    []string `json:"roles"`
	Endpoint string   `json:"endpoint"`
	Address  string   `json:"probe_address"` // where the peer answers (--answer)
	// Listen and Peer are the single-link commands that measure it: Listen
	// on the peer, Peer on this rank.
	Listen string `json:"listen_command"`
	Probe  string `json:"peer_command"`
	// Measured has one report per slot size; Profile the figures a
	// hardware profile's link takes from them.
	Measured []*rdma.LinkReport `json:"measured,omitempty"`
	Profile  *linkProfile       `json:"profile,omitempty"`
	Err      string             `json:"error,omitempty"`
}

// linkProfile is a link's figures in the terms of a hardware profile's
// link (configs/hardware, bench/sim): the round trip in microseconds (the
// simulator prices one message at half of it plus its bytes at GBps) and
// the rate, both from the slot size that moved checked frames fastest.
type linkProfile struct {
	RTTUS    float64 `json:"rtt_us"`
	GBps     float64 `json:"gb_per_s"`
	SlotSize int     `json:"slot_size"`
}

// probeLayout reads the group file as the worker does (its secret
// included). With a model directory the layers and the tensor split are
// checked against the model; without one, only the layout's shape is (the
// layers count as the listed ones, or one per stage).
func probeLayout(path, modelDir string) (*rank.Layout, error) {
	numLayers := 0
	if modelDir != "" {
		c, err := model.LoadConfig(filepath.Join(modelDir, "config.json"))
		if err != nil {
			return nil, fmt.Errorf("--model: %w", err)
		}
		numLayers = c.NumLayers
		l, _, err := loadGroup(path, numLayers)
		if err != nil {
			return nil, err
		}
		return l, l.CheckModel(c)
	}
	v, err := config.ReadFile(path, groupKeys)
	if err != nil {
		return nil, fmt.Errorf("group %w", err)
	}
	var gf groupFile
	if err := v.Unmarshal(&gf); err != nil {
		return nil, fmt.Errorf("group config %s: %w", path, err)
	}
	numLayers = len(gf.Ranks) / max(gf.Tensor, 1)
	for _, r := range gf.Ranks {
		if len(r.Layers) == 2 {
			numLayers = max(numLayers, r.Layers[1])
		}
	}
	l, _, err := loadGroup(path, max(numLayers, 1))
	return l, err
}

// rankLinks lists rank r's links in the order of their peers' ranks.
func rankLinks(l *rank.Layout, r int) ([]*probeLink, error) {
	n := len(l.Ranks)
	if r < 0 || r >= n {
		return nil, fmt.Errorf("--rank %d: group %q has ranks 0 to %d", r, l.Group, n-1)
	}
	byPeer := map[int]*probeLink{}
	add := func(p int, role string) {
		if p == r {
			return
		}
		pl := byPeer[p]
		if pl == nil {
			pl = &probeLink{Peer: p, Endpoint: l.Ranks[p].Endpoint}
			pl.Stage, pl.TRank = l.StageOf(p)
			byPeer[p] = pl
		}
		if !slices.Contains(pl.Roles, role) {
			pl.Roles = append(pl.Roles, role)
		}
	}
	add((r+1)%n, roleRingNext)
	add((r+n-1)%n, roleRingPrev)
	s, t := l.StageOf(r)
	for _, p := range collective.Peers(t, l.TensorRanks()) {
		add(l.RankOf(s, p), roleCollective)
	}
	var out []*probeLink
	for _, p := range byPeer {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *probeLink) int { return a.Peer - b.Peer })
	return out, nil
}

// probeAddress is where a rank with endpoint ep answers probes: the port
// its worker takes RDMA link bootstraps on, the endpoint's + 1.
func probeAddress(ep string) (string, error) {
	host, port, err := splitPort(ep)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", ep, err)
	}
	return net.JoinHostPort(host, strconv.Itoa(port+1)), nil
}

// groupLinks resolves o's group, rank and links, with the commands that
// measure each link alone.
func groupLinks(o *probeOptions) (*groupInfo, []*probeLink, error) {
	l, err := probeLayout(o.groupConfig, o.model)
	if err != nil {
		return nil, nil, fmt.Errorf("rdma-probe: %w", err)
	}
	links, err := rankLinks(l, o.rank)
	if err != nil {
		return nil, nil, fmt.Errorf("rdma-probe: %w", err)
	}
	g := &groupInfo{Name: l.Group, File: o.groupConfig, Ranks: len(l.Ranks), Stages: l.Stages(), Tensor: l.TensorRanks(), Rank: o.rank}
	g.Stage, g.TRank = l.StageOf(o.rank)
	if g.Address, err = probeAddress(l.Ranks[o.rank].Endpoint); err != nil {
		return nil, nil, fmt.Errorf("rdma-probe: rank %d: %w", o.rank, err)
	}
	common := fmt.Sprintf(" --slot-sizes %s --slots %d", o.slotSizesArg, o.slots)
	g.Answer = fmt.Sprintf("decode-worker rdma-probe --group-config %s --rank P --answer%s", o.groupConfig, common)
	g.Measure = fmt.Sprintf("decode-worker rdma-probe --group-config %s --rank %d --measure%s", o.groupConfig, o.rank, common)
	for _, pl := range links {
		if pl.Address, err = probeAddress(pl.Endpoint); err != nil {
			return nil, nil, fmt.Errorf("rdma-probe: rank %d: %w", pl.Peer, err)
		}
		pl.Listen = "decode-worker rdma-probe --listen " + pl.Address + common
		pl.Probe = "decode-worker rdma-probe --peer " + pl.Address + common
	}
	return g, links, nil
}

// measureLinks probes each link in turn, every slot size, recording each
// link's reports, figures and error; it returns the errors joined.
func measureLinks(ctx context.Context, o *probeOptions, cfgs []rdma.Config, links []*probeLink) error {
	var errs []error
	for _, pl := range links {
		reps, err := measurePeer(ctx, o, cfgs, pl.Address)
		pl.Measured = reps
		pl.Profile = profileOf(reps)
		if err != nil {
			pl.Err = err.Error()
			errs = append(errs, fmt.Errorf("link to rank %d (%s): %w", pl.Peer, strings.Join(pl.Roles, ", "), err))
		}
	}
	return errors.Join(errs...)
}

// profileOf picks the figures of the slot size that moved checked frames
// fastest, or nil when none did.
func profileOf(reps []*rdma.LinkReport) *linkProfile {
	var best *rdma.LinkReport
	for _, r := range reps {
		if r.GBps > 0 && r.BadFrames == 0 && (best == nil || r.GBps > best.GBps) {
			best = r
		}
	}
	if best == nil {
		return nil
	}
	return &linkProfile{RTTUS: best.RTTP50us, GBps: best.GBps, SlotSize: best.SlotSize}
}

// worstProfile is what one profile for all the links must say, the
// simulator pricing every link of the group alike: the longest round trip
// and the lowest rate among them.
func worstProfile(links []*probeLink) *linkProfile {
	var w *linkProfile
	for _, pl := range links {
		p := pl.Profile
		if p == nil {
			continue
		}
		if w == nil {
			c := *p
			w = &c
			continue
		}
		w.RTTUS, w.GBps = max(w.RTTUS, p.RTTUS), min(w.GBps, p.GBps)
		if p.GBps == w.GBps {
			w.SlotSize = p.SlotSize
		}
	}
	return w
}
