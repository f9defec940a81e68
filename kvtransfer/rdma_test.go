package kvtransfer

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
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

// TestSharedPort: a rank listening with Shared takes a TCP sender (the
// prefill worker) and an RDMA sender on the same port.
func TestSharedPort(t *testing.T) {
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	rt := fakeRDMA(t, fab, "rank0", rdma.Config{}).(RDMA).T
	r := newRigOn(t, "small", 1, ServerConfig{ChunkSize: 16 << 10, Transport: Shared{RDMA: rt}}, fab, rdma.Config{})
	for i, client := range []Transport{&TCP{}, Shared{RDMA: r.client.(RDMA).T}} {
		src := smallSeq(t, r, 50, uint64(i))
		r.client = client
		o := r.transfer(fmt.Sprintf("shared-%d", i), r.place, src, 2, 10*time.Second, fast)
		r.check(o, src, true)
	}
}

// TestChooseTransport: tcp is TCP; rdma fails and auto falls back to TCP
// when no device has an ACTIVE port with a GID for the address; with one,
// both give the shared RDMA transport.
func TestChooseTransport(t *testing.T) {
	lo := net.IPv4(127, 0, 0, 1)
	if tr, err := ChooseTransport("tcp", rdma.Config{}, lo, nil); err != nil || tr.(*TCP) == nil {
		t.Fatalf("tcp: %T %v", tr, err)
	}
	if _, err := ChooseTransport("udp", rdma.Config{}, lo, nil); err == nil {
		t.Fatal("unknown mode accepted")
	}
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	up := fab.Host("up", loopGID)
	down := fab.Host("down", loopGID)
	fab.PortDown("down")
	if _, err := ChooseTransport("rdma", rdma.Config{Provider: down}, lo, nil); err == nil || !strings.Contains(err.Error(), "DOWN") {
		t.Fatalf("rdma with the port down: %v", err)
	}
	if tr, err := ChooseTransport("auto", rdma.Config{Provider: down}, lo, nil); err != nil {
		t.Fatal(err)
	} else if _, ok := tr.(*TCP); !ok {
		t.Fatalf("auto with the port down gave %T", tr)
	}
	if tr, err := ChooseTransport("auto", rdma.Config{Provider: up}, net.IPv4(10, 9, 8, 7), nil); err != nil {
		t.Fatal(err)
	} else if _, ok := tr.(*TCP); !ok {
		t.Fatalf("auto with no GID for the address gave %T", tr)
	}
	for _, mode := range []string{"rdma", "auto"} {
		tr, err := ChooseTransport(mode, rdma.Config{Provider: up}, lo, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := tr.(Shared)
		if !ok {
			t.Fatalf("%s with a device gave %T", mode, tr)
		}
		s.RDMA.Close()
	}
	// No library (what the system binding gives where none is installed):
	// rdma fails naming it, auto is TCP.
	gone := verbs.Unavailable(fmt.Errorf("%w: /nowhere/libibverbs.so.1: not found", verbs.ErrNoLibrary))
	for _, p := range []verbs.Provider{nil, gone} {
		if _, err := ChooseTransport("rdma", rdma.Config{Provider: p}, lo, nil); !errors.Is(err, verbs.ErrNoLibrary) {
			t.Fatalf("rdma without a library (%v): %v", p, err)
		}
		if tr, err := ChooseTransport("auto", rdma.Config{Provider: p}, lo, nil); err != nil {
			t.Fatal(err)
		} else if _, ok := tr.(*TCP); !ok {
			t.Fatalf("auto without a library gave %T", tr)
		}
	}
}

// TestSystemVerbsNotLinked: kvtransfer (so every binary that moves state)
// does not link the system verbs binding. It uses purego, whose fakecgo
// runtime makes every thread with pthread_create; only a binary that may
// choose RDMA (decode-worker) should pay for that, by importing sysverbs.
func TestSystemVerbsNotLinked(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "purego") || strings.HasSuffix(dep, "/sysverbs") {
			t.Errorf("kvtransfer depends on %s", dep)
		}
	}
}
