package service

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/configs"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
)

// TestTensorGroups: a group of pipeline stages of tensor ranks is usable
// when its ranks complete every stage's tensor ranks on the stage's
// layers; otherwise the problem names the rank. A tensor rank holds its
// KDA slices only, so the same memory holds more tokens than unsplit.
func TestTensorGroups(t *testing.T) {
	b, err := configs.ModelPreset("small")
	if err != nil {
		t.Fatal(err)
	}
	m, err := modelinfo.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	half := m.NumLayers / 2
	budget := m.StateBytes(half, m.NumLayers, 100) // an unsplit rank of the longer stage holds 100 tokens
	ranks := func(stages, tensor int) map[string]cp.WorkerInfo {
		out := map[string]cp.WorkerInfo{}
		for r := 0; r < stages*tensor; r++ {
			s := r / tensor
			lr := cp.LayerRange{First: s * m.NumLayers / stages, End: (s + 1) * m.NumLayers / stages}
			w := cp.WorkerInfo{ID: fmt.Sprintf("r%d", r), Kind: cp.KindDecode, Model: m.ID, GroupID: "g", Rank: r, GroupSize: stages * tensor,
				Layers: lr, TensorRank: r % tensor, TensorRanks: tensor, MemoryTotal: uint64(budget), Time: time.Now()}
			if tensor == 1 {
				w.TensorRank, w.TensorRanks = 0, 0
			}
			out[w.ID] = w
		}
		return out
	}
	gs, problems := groups(ranks(2, 2), m)
	if len(gs) != 1 || len(problems) != 0 {
		t.Fatalf("2x2 group: %d usable, problems %v", len(gs), problems)
	}
	if st := gs[0].stages(); len(st) != 2 || st[0].End != half || st[1].First != half {
		t.Errorf("2x2 group's pipeline: %v, want its two stages", st)
	}
	plain, _ := groups(ranks(2, 1), m)
	if len(plain) != 1 || plain[0].Capacity != 100 || gs[0].Capacity <= 100 {
		t.Errorf("capacity: tensor ranks %d tokens, unsplit %d groups: want more than 100 = unsplit", gs[0].Capacity, len(plain))
	} else if want := m.MaxShardTokens(half, m.NumLayers, budget, 2); gs[0].Capacity != want {
		t.Errorf("capacity: tensor ranks %d tokens, want %d", gs[0].Capacity, want)
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]cp.WorkerInfo)
		want string
	}{
		{"mixed tensor sizes", func(ws map[string]cp.WorkerInfo) { w := ws["r3"]; w.TensorRanks = 4; ws["r3"] = w },
			"decode group.placement[3].tensor_ranks: is 4, rank 0's 2"},
		{"tensor rank out of place", func(ws map[string]cp.WorkerInfo) { w := ws["r2"]; w.TensorRank = 1; ws["r2"] = w },
			"decode group.placement[2].tensor_rank: is 1 at rank 2 with tensor_ranks 2"},
		{"stage layers differ", func(ws map[string]cp.WorkerInfo) { w := ws["r1"]; w.Layers.End--; ws["r1"] = w },
			"decode group.placement[1].layers: is"},
		{"tensor rank missing", func(ws map[string]cp.WorkerInfo) { delete(ws, "r3") },
			"rank(s) 3 of 4 not registered"},
	} {
		ws := ranks(2, 2)
		tc.edit(ws)
		gs, problems := groups(ws, m)
		if len(gs) != 0 || len(problems) != 1 || !strings.Contains(problems[0], tc.want) {
			t.Errorf("%s: %d usable, problems %q, want %q", tc.name, len(gs), problems, tc.want)
		}
	}
}
