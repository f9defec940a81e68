package cpadapter

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
)

// TestRequestChecksTensorRanks: the group's head takes an assignment only
// if each placement entry's tensor rank is the group's rank's: the
// prefill worker cuts each rank's state by it.
func TestRequestChecksTensorRanks(t *testing.T) {
	eps := []string{"h:1", "h:2", "h:3", "h:4"}
	l, err := rank.EvenTensor("g", 10, eps, 2)
	if err != nil {
		t.Fatal(err)
	}
	a := &Adapter{cfg: Config{Layout: l, WorkerID: "d0"}, log: zap.NewNop()}
	assignment := func() *cp.Assignment {
		as := &cp.Assignment{JobID: "j", Role: cp.RoleDecode, WorkerID: "d0", GroupID: "g", Client: "c", TokenIDs: []int32{5},
			CachedTokens: 3, Sampling: cp.Sampling{MaxTokens: 2}}
		for r, s := range l.Ranks {
			sh := l.Shard(r)
			as.Placement = append(as.Placement, cp.LayerPlacement{Rank: r, WorkerID: fmt.Sprintf("d%d", r), Layers: cp.LayerRange{First: s.Lo, End: s.Hi},
				TensorRank: sh.Rank, TensorRanks: sh.Ranks, Transfer: s.Endpoint, SessionID: "s", Secret: cp.NewSecret()})
		}
		return as
	}
	req, err := a.request(assignment())
	if err != nil || req.Remote == nil || len(req.Remote.Sessions) != 4 {
		t.Fatalf("a 2x2 group's remote job: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*cp.Assignment)
		want string
	}{
		{"unsplit placement", func(as *cp.Assignment) {
			for i := range as.Placement {
				as.Placement[i].TensorRank, as.Placement[i].TensorRanks = 0, 0
			}
		}, "placement rank 0 is tensor rank 0 of 0, the group's rank 0 is tensor rank 0 of 2"},
		{"swapped tensor ranks", func(as *cp.Assignment) {
			as.Placement[2].TensorRank, as.Placement[3].TensorRank = 1, 0
		}, "placement rank 2 is tensor rank 1 of 2, the group's rank 2 is tensor rank 0 of 2"},
	} {
		as := assignment()
		tc.edit(as)
		if _, err := a.request(as); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestTensorRankRoom: a tensor rank sizes the sequences it has room for as
// its table reserves them, its slice of the KDA state and the whole MLA
// cache: more tokens fit in a budget than on an unsplit rank of the same
// layers, and exactly as many as the table admits.
func TestTensorRankRoom(t *testing.T) {
	c, err := model.LoadConfig(filepath.Join(testmodel.Dir(t, "tiny", 1, 2), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	room := func(tensor int) (int, *rank.Table) {
		l, err := rank.EvenTensor("g", c.NumLayers, []string{"h:1", "h:2"}[:tensor], tensor)
		if err != nil {
			t.Fatal(err)
		}
		a := &Adapter{cfg: Config{Layout: l, Model: c, LatentDType: model.BF16}, lo: 0, hi: c.NumLayers, maxSeq: 1 << 20, log: zap.NewNop()}
		const budget = 4 << 20
		return a.maxTokens(budget), rank.NewTable(c, 0, c.NumLayers, budget, model.StateOptions{LatentDType: model.BF16, Shard: l.Shard(0)})
	}
	whole, _ := room(1)
	n, table := room(2)
	if n <= whole {
		t.Fatalf("a tensor rank has room for %d tokens, an unsplit one %d", n, whole)
	}
	if _, err := table.Admit("fits", n); err != nil {
		t.Fatalf("the advertised %d tokens do not fit the rank's table: %v", n, err)
	}
	table.Free("fits")
	if _, err := table.Admit("over", n+1); err == nil {
		t.Fatalf("the table takes %d tokens, more than the advertised room", n+1)
	}
}
