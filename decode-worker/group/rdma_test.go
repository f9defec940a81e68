package group

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// TestGreedyOverFakeRDMA: a group whose ranks run their mesh (and, with
// tensor-parallel stages, their stage's all-reduce) over the RDMA link on
// the fake verbs wire (each rank a host of the fabric, listening with
// kvtransfer.Shared as decode-worker does) generates the same greedy ids as
// the same group over TCP and as the monolithic model, on a clean wire and
// on one that loses messages; the steps went over the wire.
func TestGreedyOverFakeRDMA(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := []int32{5, 17, 200, 33, 4, 250}
	const n = 24
	want := ref.Greedy(t, p, n)
	generate := func(t *testing.T, opt Options) []int32 {
		t.Helper()
		g := startGroup(t, opt)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		got, err := g.Generate(ctx, "s1", p, n)
		if err != nil {
			t.Fatal(err)
		}
		g.checkFreed(t)
		return got
	}
	layouts := []struct{ ranks, tensor int }{{2, 1}, {3, 1}, {2, 2}, {4, 2}}
	if testing.Short() {
		layouts = layouts[:3] // 2 x 2 in the full run only (qemu runs -short)
	}
	for _, l := range layouts {
		ranks := l.ranks
		opts := func() Options {
			opt := fastOpts(dir, ranks)
			opt.Tensor = l.tensor
			return opt
		}
		overTCP := generate(t, opts())
		if !slices.Equal(overTCP, want) {
			t.Fatalf("group of %d (tensor %d) over TCP: %v\nmonolithic: %v", ranks, l.tensor, overTCP, want)
		}
		for _, wire := range []struct {
			name string
			f    fakeverbs.Faults
		}{{"clean", fakeverbs.Faults{}}, {"lossy", fakeverbs.Faults{LoseNth: []int64{5, 12, 13, 30, 31, 32, 60, 90}, Loss: 0.02}}} {
			t.Run(fmt.Sprintf("ranks%d-tensor%d/%s", ranks, l.tensor, wire.name), func(t *testing.T) {
				fab := fakeverbs.NewFabric(wire.f, uint64(ranks))
				trs := make([]*rdma.Transport, ranks)
				for r := range trs {
					tr, err := rdma.New(rdma.Config{Provider: fab.Host(fmt.Sprintf("rank%d", r), verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))),
						SlotSize: 32 << 10, Slots: 16, RTO: 2 * time.Millisecond})
					if err != nil {
						t.Fatal(err)
					}
					trs[r] = tr
					t.Cleanup(func() { tr.Close() }) // after the group's (cleanups run last first)
				}
				opt := opts()
				opt.Transport = func(r int) kvtransfer.Transport { return kvtransfer.Shared{RDMA: trs[r]} }
				got := generate(t, opt)
				if !slices.Equal(got, overTCP) {
					t.Fatalf("over fake RDMA: %v\nover TCP:      %v", got, overTCP)
				}
				st := fab.Stats()
				for r, tr := range trs {
					if ls := tr.Stats(); ls.SlotsReceived == 0 {
						t.Errorf("rank %d received nothing over RDMA (%+v): the mesh did not use it", r, ls)
					}
				}
				if wire.f.Loss > 0 && st.Lost < int64(len(wire.f.LoseNth)) {
					t.Errorf("the wire lost nothing (%+v): the lossy case proves nothing", st)
				}
				t.Logf("wire %+v", st)
			})
		}
	}
}
