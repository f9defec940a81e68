package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/sysverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// TestRDMAProbeNoLibrary: without a verbs library, rdma-probe fails
// naming the library it looked for.
func TestRDMAProbeNoLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "librdma.dylib")
	var out bytes.Buffer
	err := rdmaProbe(context.Background(), []string{"--library", missing}, &out)
	if !errors.Is(err, verbs.ErrNoLibrary) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("rdma-probe without a library: %v", err)
	}
}

// TestRDMAProbeNoDevice: with the system's library but no RDMA device
// (this machine and CI: libibverbs without a kernel RDMA subsystem),
// rdma-probe prints the environment and fails saying there is no device.
func TestRDMAProbeNoDevice(t *testing.T) {
	p, err := sysverbs.System()
	if err != nil {
		t.Skipf("no verbs library here: %v", err)
	}
	if names, err := p.Devices(); err == nil && len(names) > 0 {
		t.Skipf("this machine has RDMA devices %v", names)
	}
	var out bytes.Buffer
	err = rdmaProbe(context.Background(), []string{"--json"}, &out)
	if !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("rdma-probe without a device: %v", err)
	}
	var rep probeReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.OS == "" || rep.Library != sysverbs.DefaultLibrary() {
		t.Fatalf("report %q: %+v, %v", out.String(), rep, err)
	}
}

// TestRDMAProbeFakeLink: on the fake verbs wire, a listener and a prober
// measure two slot sizes: every checked frame arrives intact, on a clean
// wire and on one that loses messages (the link resends them); the
// environment lists the device, its port and GID.
func TestRDMAProbeFakeLink(t *testing.T) {
	gid := verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))
	for _, tc := range []struct {
		name string
		f    fakeverbs.Faults
	}{{"clean", fakeverbs.Faults{}}, {"lossy", fakeverbs.Faults{Loss: 0.02, LoseNth: []int64{20, 21, 40}}}} {
		t.Run(tc.name, func(t *testing.T) {
			fab := fakeverbs.NewFabric(tc.f, 5)
			args := []string{"--slot-sizes", "32KiB,128KiB", "--bytes", "4MiB", "--frame", "300KiB", "--pings", "20", "--json", "--timeout", "30s"}
			lo, err := parseProbe(append([]string{"--listen", "127.0.0.1:0"}, args...), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			lout := &syncWriter{ch: make(chan []byte, 1)}
			lerr := make(chan error, 1)
			go func() { lerr <- runProbe(ctx, lo, fab.Host("b", gid), "fake", lout) }()
			var lrep probeReport
			select {
			case b := <-lout.ch:
				if err := json.Unmarshal(b, &lrep); err != nil {
					t.Fatal(err)
				}
			case err := <-lerr:
				t.Fatalf("listener: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the listener reported nothing")
			}
			defer func() {
				cancel()
				if err := <-lerr; err != nil {
					t.Errorf("listener: %v", err)
				}
			}()
			if len(lrep.Listening) != 2 || len(lrep.Devices) != 1 || len(lrep.Devices[0].Ports) == 0 ||
				!lrep.Devices[0].Ports[0].Usable() || !slices.ContainsFunc(lrep.Devices[0].Ports[0].GIDs, func(g rdma.GIDInfo) bool { return g.GID == "127.0.0.1" }) {
				t.Fatalf("listener's report: %+v", lrep)
			}
			po, err := parseProbe(append([]string{"--peer", lrep.Listening[0]}, args...), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := runProbe(context.Background(), po, fab.Host("a", gid), "fake", &out); err != nil {
				t.Fatalf("probe: %v\n%s", err, out.String())
			}
			var rep probeReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatal(err)
			}
			if len(rep.Links) != 2 {
				t.Fatalf("%d links measured, want 2: %s", len(rep.Links), out.String())
			}
			var resent int64
			for i, l := range rep.Links {
				if l.SlotSize != []int{32 << 10, 128 << 10}[i] || l.Bytes != 4<<20 || l.Frames != 14 || l.BadFrames != 0 || l.GBps <= 0 || l.RTTP50us <= 0 {
					t.Errorf("link %d: %+v", i, l)
				}
				resent += l.Link.Retransmits
			}
			if tc.f.Loss > 0 && resent == 0 {
				t.Errorf("a lossy wire and nothing resent: %+v", fab.Stats())
			}
			t.Logf("wire %+v", fab.Stats())
		})
	}
}

// TestRDMAProbePeerUnreachable: a peer that does not answer is reported
// unreachable, naming it, within the timeout.
func TestRDMAProbePeerUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	o, err := parseProbe([]string{"--peer", addr, "--slot-sizes", "32KiB", "--timeout", "10s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = runProbe(context.Background(), o, fab.Host("a", verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))), "fake", &out)
	if err == nil || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("probe of a dead address: %v", err)
	}
}

// TestRDMAProbeFlags: bad flags are refused naming the flag.
func TestRDMAProbeFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "a:1", "--peer", "b:2"},
		{"--slot-sizes", "32KiB,lots"},
		{"--bytes", "-1"},
		{"--frame", "1GiB"},
		{"--slots", "2"},
		{"extra"},
		{"--group-config", "g.yaml", "--peer", "b:2"},
		{"--group-config", "g.yaml", "--listen", "a:1"},
		{"--answer"},
		{"--measure"},
		{"--model", "m"},
		{"--group-config", "g.yaml", "--answer", "--measure"},
	} {
		if _, err := parseProbe(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// syncWriter hands each write to a channel (the listener's report).
type syncWriter struct{ ch chan []byte }

func (w *syncWriter) Write(b []byte) (int, error) {
	select {
	case w.ch <- append([]byte(nil), b...):
	default:
	}
	return len(b), nil
}
