package kvtransfer

import (
	"errors"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
)

// rdmaSmall is a link with small slots, so that the small model's state
// spans many slots and every fault meets data.
var rdmaSmall = rdma.Config{SlotSize: 32 << 10, Slots: 8, Reserve: 2, RTO: 2 * time.Millisecond, MaxRTO: 50 * time.Millisecond}

// TestRDMAFaultsRecovered streams a sequence over the RDMA link on the fake
// wire under each fault the link must absorb: the state commits
// byte-identical (no corrupt chunk is ever committed), the fault happened,
// and nothing stays allocated.
func TestRDMAFaultsRecovered(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    fakeverbs.Faults
	}{
		{"loss1pct", fakeverbs.Faults{Loss: 0.01}},
		{"loss5pct", fakeverbs.Faults{Loss: 0.05}},
		{"nth", fakeverbs.Faults{LoseNth: []int64{3, 4, 10, 50, 51, 52, 53, 200}}},
		{"tail", fakeverbs.Faults{TailLoss: 3 * time.Millisecond, MaxFaults: 8}},
		{"delay", fakeverbs.Faults{Delay: 2 * time.Millisecond}},
		{"flips", fakeverbs.Faults{Flip: 0.03, MaxFaults: 30}},
		{"noRecvBlock", fakeverbs.Faults{Loss: 0.02, NoRecv: fakeverbs.NoRecvBlock}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fab := fakeverbs.NewFabric(tc.f, 7)
			r := newRigOn(t, "small", 2, ServerConfig{ChunkSize: 16 << 10}, fab, rdmaSmall)
			src := smallSeq(t, r, 200, 11)
			o := r.transfer(tc.name, r.place, src, 2, 20*time.Second, fast)
			r.check(o, src, true)
			st := fab.Stats()
			if tc.name != "delay" && st.Lost+st.TailLost+st.Flipped == 0 {
				t.Errorf("no fault was injected (%+v): the test proves nothing", st)
			}
			t.Logf("wire %+v", st)
		})
	}
}

// TestRDMAPeerGone: a rank that goes silent mid-transfer (its queue pair
// and its anchor alive but deaf) or whose cable is pulled makes the
// transfer fail with a clear error at its deadline, never hang, commit or
// leak.
func TestRDMAPeerGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    fakeverbs.Faults
	}{
		{"silent", fakeverbs.Faults{SilenceAfter: 40, Silence: "rank0"}},
		{"pulled", fakeverbs.Faults{PullAfter: 40, Pull: "prefill"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fab := fakeverbs.NewFabric(tc.f, 3)
			rc := rdmaSmall
			rc.Retries = 6
			r := newRigOn(t, "small", 1, ServerConfig{ChunkSize: 16 << 10}, fab, rc)
			src := smallSeq(t, r, 200, 12)
			o := r.transfer(tc.name, r.place, src, 2, 1500*time.Millisecond, fast)
			r.check(o, src, false)
			if o.sendErr == nil {
				t.Fatal("the transfer succeeded without its peer")
			}
			var e *Error
			if !errors.As(o.sendErr, &e) || e.Peer == "" {
				t.Errorf("sender error names no peer: %v", o.sendErr)
			}
			t.Logf("sender: %v; wire %+v", o.sendErr, fab.Stats())
		})
	}
}
