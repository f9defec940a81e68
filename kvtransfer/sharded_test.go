package kvtransfer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// sharded is the placement of a stages x tensor group over the rig's
// servers (stage-major, as a decode layout numbers its ranks).
func (r *rig) sharded(stages, tensor int) *Sharded {
	r.t.Helper()
	var firsts []string
	for s := 0; s < stages; s++ {
		firsts = append(firsts, r.servers[s*tensor].Addr())
	}
	byStage, err := Contiguous(r.cfg.NumLayers, firsts)
	if err != nil {
		r.t.Fatal(err)
	}
	layers := map[int][]Dest{}
	for L, ep := range byStage {
		s := 0
		for firsts[s] != ep {
			s++
		}
		for t := 0; t < tensor; t++ {
			layers[L] = append(layers[L], Dest{Endpoint: r.servers[s*tensor+t].Addr(), Shard: model.Shard{Rank: t, Ranks: tensor}})
		}
	}
	p, err := NewSharded(r.cfg, layers)
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

// TestShardedPlacement ships a prefilled state to the tensor ranks of a
// 1x2 and a 2x2 group: each rank commits exactly its slice
// (model.Config.ShardSeqState) of its stage's layers, byte for byte, and
// receives only its slice's bytes, a KDA layer's state halved.
func TestShardedPlacement(t *testing.T) {
	for _, tc := range []struct{ stages, tensor int }{{1, 2}, {2, 2}} {
		r := newRig(t, "tiny", tc.stages*tc.tensor, ServerConfig{ChunkSize: 1024})
		place := r.sharded(tc.stages, tc.tensor)
		const T = 37
		all := kvtest.AllLayers(r.cfg.NumLayers)
		src := kvtest.RandomSeq(r.cfg, all, T, model.BF16, 5)
		var ins []*Incoming
		for _, srv := range r.servers {
			layers, shard := place.Layers(srv.Addr())
			in, err := srv.Expect(ExpectSpec{Session: "tp", Secret: testSecret, Model: r.cfg, Layers: layers, Tokens: T,
				Shard: shard, Deadline: time.Now().Add(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			ins = append(ins, in)
		}
		s, err := NewSender(SenderConfig{Transport: r.client, Session: "tp", Secret: testSecret, Placement: place,
			Deadline: time.Now().Add(10 * time.Second), Timeouts: fast})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := putAll(ctx, t, s, src, all, 4, 2); err != nil {
			s.Abort(err)
			t.Fatal(err)
		}
		if err := s.Close(ctx, T); err != nil {
			t.Fatal(err)
		}
		var sum int64
		for i, in := range ins {
			st, err := in.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			layers, shard := place.Layers(r.servers[i].Addr())
			want, err := r.cfg.ShardSeqState(src, shard)
			if err != nil {
				t.Fatal(err)
			}
			if err := kvtest.Diff(want, st, layers); err != nil {
				t.Fatalf("%dx%d rank %d (%s): %v", tc.stages, tc.tensor, i, shard, err)
			}
			// The bytes the rank got: its slice, KDA state over tensor.
			var slice, whole int64
			for _, L := range layers {
				slice += int64(want.Layers[L].Bytes())
				whole += int64(src.Layers[L].Bytes())
				if r.cfg.LayerKind(L) == model.KDA && want.Layers[L].Bytes()*tc.tensor != src.Layers[L].Bytes() {
					t.Errorf("rank %d layer %d: slice of %d bytes, whole %d", i, L, want.Layers[L].Bytes(), src.Layers[L].Bytes())
				}
			}
			got, wantB := in.Progress()
			if got != slice || wantB != slice || r.servers[i].Stats().BytesVerified != slice || slice >= whole {
				t.Errorf("%dx%d rank %d: received %d of %d bytes (server verified %d), want its slice %d < whole %d",
					tc.stages, tc.tensor, i, got, wantB, r.servers[i].Stats().BytesVerified, slice, whole)
			}
			sum += slice
		}
		if st := s.Stats(); st.ChunksResent == 0 && st.BytesSent != sum {
			t.Errorf("%dx%d: sender sent %d bytes, the slices hold %d", tc.stages, tc.tensor, st.BytesSent, sum)
		}
		r.checkFreed()
	}
}

// TestShardedAppend: an append (MLA rows after a base the ranks hold)
// goes whole to every tensor rank, the KDA states as slices.
func TestShardedAppend(t *testing.T) {
	const T, base = 100, 64
	r := newRig(t, "tiny", 2, ServerConfig{})
	place := r.sharded(1, 2)
	all := kvtest.AllLayers(r.cfg.NumLayers)
	delta := kvtest.RandomSeq(r.cfg, all, T-base, model.BF16, 8)
	delta.Tokens = T
	var ins []*Incoming
	for _, srv := range r.servers {
		layers, shard := place.Layers(srv.Addr())
		in, err := srv.Expect(ExpectSpec{Session: "tp-app", Secret: testSecret, Model: r.cfg, Layers: layers, Tokens: T,
			Base: base, BaseKey: 7, Shard: shard, Deadline: time.Now().Add(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	s, err := NewSender(SenderConfig{Transport: r.client, Session: "tp-app", Secret: testSecret, Placement: place,
		Deadline: time.Now().Add(10 * time.Second), Timeouts: fast, Base: base, BaseKey: 7})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := putAll(ctx, t, s, delta, all, 2, 2); err != nil {
		s.Abort(err)
		t.Fatal(err)
	}
	if err := s.Close(ctx, T); err != nil {
		t.Fatal(err)
	}
	for i, in := range ins {
		st, err := in.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want, err := r.cfg.ShardSeqState(delta, model.Shard{Rank: i, Ranks: 2})
		if err != nil {
			t.Fatal(err)
		}
		if err := kvtest.Diff(want, st, all); err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	r.checkFreed()
}

// TestShardedRefusesWhole: a tensor rank refuses a whole (unsliced) KDA
// state, naming both shapes and its slice or the sizes it expects, and
// commits nothing.
func TestShardedRefusesWhole(t *testing.T) {
	r := newRig(t, "tiny", 2, ServerConfig{})
	const T = 20
	all := kvtest.AllLayers(r.cfg.NumLayers)
	src := kvtest.RandomSeq(r.cfg, all, T, model.BF16, 9)
	// The sender believes in a pipeline of two unsplit ranks; the first
	// rank expects tensor rank 0's slice of every layer.
	in, err := r.servers[0].Expect(ExpectSpec{Session: "whole", Secret: testSecret, Model: r.cfg, Layers: r.place.Layers(r.servers[0].Addr()),
		Tokens: T, Shard: model.Shard{Rank: 0, Ranks: 2}, Deadline: time.Now().Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	other := r.expectOn(1, "whole", T, model.Shard{})
	err = SendState(context.Background(), SenderConfig{Transport: r.client, Session: "whole", Secret: testSecret, Placement: r.place,
		Deadline: time.Now().Add(10 * time.Second), Timeouts: fast}, src)
	_, werr := in.Wait(context.Background())
	if err == nil || werr == nil {
		t.Fatalf("a whole state sent (%v) and committed (%v) on a tensor rank", err, werr)
	}
	// The part's header or the sender's totals, whichever arrives first
	// over the transfer's streams, refuses it.
	msg := werr.Error()
	shape := strings.Contains(msg, "expected F32 [") && strings.Contains(msg, "layer ")
	if !strings.Contains(msg, "protocol violation") || !strings.Contains(msg, "(the slice of tensor rank 0 of 2)") ||
		!shape && !strings.Contains(msg, "this rank expects") {
		t.Errorf("refusal %q names neither the slice's shapes nor its sizes, or not the slice", msg)
	}
	other.Cancel()
	r.checkFreed()
}

// expectOn registers session sid on rank i for its pipeline layers.
func (r *rig) expectOn(i int, sid string, T int, s model.Shard) *Incoming {
	r.t.Helper()
	in, err := r.servers[i].Expect(ExpectSpec{Session: sid, Secret: testSecret, Model: r.cfg, Layers: r.place.Layers(r.servers[i].Addr()),
		Tokens: T, Shard: s, Deadline: time.Now().Add(10 * time.Second)})
	if err != nil {
		r.t.Fatal(err)
	}
	return in
}

// TestNewShardedErrors: a stage's ranks must complete its tensor ranks.
func TestNewShardedErrors(t *testing.T) {
	cfg, err := kvtest.Config("tiny")
	if err != nil {
		t.Fatal(err)
	}
	sh := func(r, n int) model.Shard { return model.Shard{Rank: r, Ranks: n} }
	for _, tc := range []struct {
		name  string
		dests []Dest
		want  string
	}{
		{"missing tensor rank", []Dest{{"a:1", sh(0, 2)}}, "layer 1 has 1 ranks for tensor 2"},
		{"repeated tensor rank", []Dest{{"a:1", sh(0, 2)}, {"b:1", sh(0, 2)}}, "tensor rank 0 missing, repeated"},
		{"mixed sizes", []Dest{{"a:1", sh(0, 2)}, {"b:1", sh(1, 3)}}, "mixes tensor sizes 2 and 3"},
		{"slice and whole", []Dest{{"a:1", sh(0, 2)}, {"b:1", model.Shard{}}}, "mixes tensor sizes 2 and 1"},
		{"same endpoint", []Dest{{"a:1", sh(0, 2)}, {"a:1", sh(1, 2)}}, "goes to a:1 twice"},
		{"heads not divided", []Dest{{"a:1", sh(0, 4)}, {"b:1", sh(1, 4)}, {"c:1", sh(2, 4)}, {"d:1", sh(3, 4)}}, "tensor 4 does not divide the model's 2 KDA heads"},
		{"no rank", nil, "layer 1 has no rank"},
	} {
		if _, err := NewSharded(cfg, map[int][]Dest{1: tc.dests}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := NewSharded(cfg, map[int][]Dest{9: {{"a:1", model.Shard{}}}}); err == nil {
		t.Error("a layer outside the model placed")
	}
}
