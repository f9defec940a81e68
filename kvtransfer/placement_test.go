package kvtransfer

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

func TestContiguous(t *testing.T) {
	m, err := Contiguous(93, []string{"a", "b", "c", "d"})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{len(m.Layers("a")), len(m.Layers("b")), len(m.Layers("c")), len(m.Layers("d"))}
	if !slices.Equal(sizes, []int{24, 23, 23, 23}) || m[0] != "a" || m[23] != "a" || m[24] != "b" || m[92] != "d" {
		t.Fatalf("split %v", sizes)
	}
	if eps := m.Endpoints(); !slices.Equal(eps, []string{"a", "b", "c", "d"}) {
		t.Fatalf("endpoints %v", eps)
	}
	if _, err := Contiguous(2, []string{"a", "b", "c"}); err == nil {
		t.Fatal("more ranks than layers accepted")
	}
	if _, err := m.Routes(93, model.PartLatent, 10, nil); err == nil {
		t.Fatal("route for a layer outside the placement")
	}
	rs, err := m.Routes(30, model.PartKDAState, 100, []int{5, 5})
	if err != nil || len(rs) != 1 || rs[0].Endpoint != "b" || rs[0].Off != 0 || rs[0].Len != 100 || rs[0].Shape != nil {
		t.Fatalf("routes %v %v", rs, err)
	}
}

// everyRankMLA sends MLA layers whole to every rank and KDA layers to their
// pipeline owner: a placement with several routes per part.
type everyRankMLA struct {
	LayerMap
	cfg *model.Config
}

func (p everyRankMLA) Routes(L int, kind model.PartKind, size int, shape []int) ([]Route, error) {
	if p.cfg.LayerKind(L) != model.MLA {
		return p.LayerMap.Routes(L, kind, size, shape)
	}
	var rs []Route
	for _, ep := range p.Endpoints() {
		rs = append(rs, Route{Endpoint: ep, Len: size})
	}
	return rs, nil
}

func TestMultiRoutePlacement(t *testing.T) {
	r := newRig(t, "small", 3, ServerConfig{ChunkSize: 4096})
	place := everyRankMLA{LayerMap: r.place, cfg: r.cfg}
	all := kvtest.AllLayers(r.cfg.NumLayers)
	src := kvtest.RandomSeq(r.cfg, all, 77, model.BF16, 9)
	var ins []*Incoming
	var owned [][]int
	for _, srv := range r.servers {
		layers := r.place.Layers(srv.Addr())
		for _, L := range r.cfg.MLALayers {
			if !slices.Contains(layers, L) {
				layers = append(layers, L)
			}
		}
		in, err := srv.Expect(ExpectSpec{Session: "tp", Secret: testSecret, Model: r.cfg, Layers: layers, Tokens: 77,
			Deadline: time.Now().Add(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
		owned = append(owned, layers)
	}
	s, err := NewSender(SenderConfig{Transport: r.client, Session: "tp", Secret: testSecret, Placement: place, MaxHeld: 1, // one layer at a time
		Deadline: time.Now().Add(10 * time.Second), Timeouts: fast})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := putAll(ctx, t, s, src, all, 3, 2); err != nil {
		s.Abort(err)
		t.Fatal(err)
	}
	if err := s.Close(ctx, 77); err != nil {
		t.Fatal(err)
	}
	for i, in := range ins {
		st, err := in.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(owned[i])
		if err := kvtest.Diff(src, st, owned[i]); err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	if st := s.Stats(); st.HeldBytes != 0 {
		t.Errorf("sender holds %d bytes", st.HeldBytes)
	}
}
