package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// groupYAML is a group file of tensor ranks per stage over endpoints.
func groupYAML(tensor int, endpoints ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "group: g\nsecret: 0123456789abcdef0123\ntensor: %d\nranks:\n", tensor)
	for _, ep := range endpoints {
		fmt.Fprintf(&b, "  - endpoint: %q\n", ep)
	}
	return b.String()
}

func endpoints(n int) []string {
	eps := make([]string, n)
	for i := range eps {
		eps[i] = fmt.Sprintf("10.0.0.%d:7400", i+1)
	}
	return eps
}

// linksOf lists rank r's links from file as "peer:role+role" strings.
func linksOf(t *testing.T, file string, r int) []string {
	t.Helper()
	o, err := parseProbe([]string{"--group-config", file, "--rank", strconv.Itoa(r)}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	_, links, err := groupLinks(o)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, pl := range links {
		got = append(got, fmt.Sprintf("%d:%s", pl.Peer, strings.Join(pl.Roles, "+")))
		want, _ := probeAddress(pl.Endpoint)
		if pl.Endpoint != fmt.Sprintf("10.0.0.%d:7400", pl.Peer+1) || pl.Address != want || want != fmt.Sprintf("10.0.0.%d:7401", pl.Peer+1) ||
			!strings.Contains(pl.Probe, "--peer "+want) || !strings.Contains(pl.Listen, "--listen "+want) {
			t.Errorf("rank %d's link to rank %d: %+v", r, pl.Peer, pl)
		}
	}
	return got
}

// TestProbeLayoutLinks: each rank lists its ring neighbours and, with
// tensor > 1, its stage's collective peers (all of them up to four ranks,
// the stage's ring neighbours above), one link per peer with its roles.
func TestProbeLayoutLinks(t *testing.T) {
	const next, prev, coll = roleRingNext, roleRingPrev, roleCollective
	for _, tc := range []struct {
		name      string
		tensor, n int
		want      [][]string // by rank
	}{
		{"one rank", 1, 1, [][]string{nil}},
		{"pipeline 3", 1, 3, [][]string{{"1:" + next, "2:" + prev}, {"0:" + prev, "2:" + next}, {"0:" + next, "1:" + prev}}},
		{"pipeline 2 x tensor 2", 2, 4, [][]string{
			{"1:" + next + "+" + coll, "3:" + prev},
			{"0:" + prev + "+" + coll, "2:" + next},
			{"1:" + prev, "3:" + next + "+" + coll},
			{"0:" + next, "2:" + prev + "+" + coll},
		}},
		{"tensor 2 alone", 2, 2, [][]string{{"1:" + next + "+" + prev + "+" + coll}, {"0:" + next + "+" + prev + "+" + coll}}},
		{"pipeline 2 x tensor 3", 3, 6, [][]string{
			{"1:" + next + "+" + coll, "2:" + coll, "5:" + prev},
			{"0:" + prev + "+" + coll, "2:" + next + "+" + coll},
			{"0:" + coll, "1:" + prev + "+" + coll, "3:" + next},
			{"2:" + prev, "4:" + next + "+" + coll, "5:" + coll},
			{"3:" + prev + "+" + coll, "5:" + next + "+" + coll},
			{"0:" + next, "3:" + coll, "4:" + prev + "+" + coll},
		}},
		// Above four ranks a stage's collective is a ring of its own.
		{"tensor 6", 6, 6, [][]string{
			{"1:" + next + "+" + coll, "5:" + prev + "+" + coll},
			{"0:" + prev + "+" + coll, "2:" + next + "+" + coll},
			{"1:" + prev + "+" + coll, "3:" + next + "+" + coll},
			{"2:" + prev + "+" + coll, "4:" + next + "+" + coll},
			{"3:" + prev + "+" + coll, "5:" + next + "+" + coll},
			{"0:" + next + "+" + coll, "4:" + prev + "+" + coll},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, t.TempDir(), "group.yaml", groupYAML(tc.tensor, endpoints(tc.n)...))
			for r, want := range tc.want {
				if got := linksOf(t, file, r); strings.Join(got, " ") != strings.Join(want, " ") {
					t.Errorf("rank %d: links %q, want %q", r, got, want)
				}
			}
		})
	}
}

// TestProbeLayoutText: the listing names the rank's place and each link,
// and prints the commands that measure them.
func TestProbeLayoutText(t *testing.T) {
	file := writeFile(t, t.TempDir(), "group.yaml", groupYAML(2, endpoints(4)...))
	o, err := parseProbe([]string{"--group-config", file, "--rank", "3", "--slot-sizes", "64KiB"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	var out bytes.Buffer
	if err := runProbe(context.Background(), o, fab.Host("r3", verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))), "fake", &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"group g: 4 ranks, pipeline 2 x tensor 2; rank 3 is stage 1, tensor rank 1, answering probes on 10.0.0.4:7401",
		"link to rank 0 (stage 0, tensor rank 0; ring next): endpoint 10.0.0.1:7400, probes on 10.0.0.1:7401",
		"link to rank 2 (stage 1, tensor rank 0; ring previous, collective)",
		"on rank 2 `decode-worker rdma-probe --listen 10.0.0.3:7401 --slot-sizes 64KiB --slots 16`, then here `decode-worker rdma-probe --peer 10.0.0.3:7401 --slot-sizes 64KiB --slots 16`",
		"decode-worker rdma-probe --group-config " + file + " --rank P --answer --slot-sizes 64KiB --slots 16",
		"decode-worker rdma-probe --group-config " + file + " --rank 3 --measure --slot-sizes 64KiB --slots 16",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the listing does not say %q:\n%s", want, out.String())
		}
	}
}

// TestProbeLayoutBad: a layout the worker would refuse, a rank outside it
// and a tensor split the model does not allow are refused, saying why.
func TestProbeLayoutBad(t *testing.T) {
	dir := t.TempDir()
	tiny := filepath.Join("..", "kvtransfer", "kvtest", "testdata", "tiny") // 2 KDA heads
	for _, tc := range []struct {
		name, yaml string
		args       []string
		want       string
	}{
		{"not whole stages", groupYAML(2, endpoints(3)...), nil, "3 ranks do not make whole stages of tensor 2"},
		{"rank above", groupYAML(2, endpoints(4)...), []string{"--rank", "4"}, `--rank 4: group "g" has ranks 0 to 3`},
		{"rank below", groupYAML(1, endpoints(2)...), []string{"--rank", "-1"}, `--rank -1: group "g" has ranks 0 to 1`},
		{"tensor and heads", groupYAML(4, endpoints(4)...), []string{"--model", tiny}, "tensor 4 does not divide the model's 2 KDA heads"},
		{"shared endpoint", groupYAML(2, "a:1", "a:1"), nil, "ranks 0 and 1 share endpoint a:1"},
		{"no secret", "group: g\nranks:\n  - endpoint: a:1\n", nil, "the mesh secret has 0 bytes"},
		{"unknown key", "group: g\ntensors: 2\nranks:\n  - endpoint: a:1\n", nil, "tensors"},
		{"stage layers differ", "group: g\nsecret: 0123456789abcdef0123\ntensor: 2\nranks:\n  - {endpoint: a:1, layers: [0, 2]}\n  - {endpoint: b:1, layers: [0, 3]}\n", nil,
			"a stage's tensor ranks share its layers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml", tc.yaml)
			o, err := parseProbe(append([]string{"--group-config", file}, tc.args...), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
			var out bytes.Buffer
			err = runProbe(context.Background(), o, fab.Host("a", verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))), "fake", &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rdma-probe") {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestProbeLayoutMeasure: on the fake verbs wire, rank 1 of pipeline 2 x
// tensor 2 measures its two links, to rank 0 (answering with --listen) and
// to rank 2 (answering with --answer on its endpoint's port + 1): every
// checked frame arrives intact, each link has profile figures and the
// report the worst of them. With rank 2 gone, its link fails, named, and
// rank 0's is still measured.
func TestProbeLayoutMeasure(t *testing.T) {
	gid := verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 3)
	args := []string{"--slot-sizes", "32KiB", "--bytes", "2MiB", "--frame", "256KiB", "--pings", "20", "--json", "--timeout", "20s"}
	dir := t.TempDir()
	// Rank 0 answers on a port the system picks; its endpoint is the port
	// below. Rank 2's endpoint is a port free a moment ago, minus one.
	r0 := startProbe(t, fab.Host("r0", gid), append([]string{"--listen", "127.0.0.1:0"}, args...))
	_, p0, _ := splitPort(r0.addrs[0])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p2 := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	file := writeFile(t, dir, "group.yaml", groupYAML(2, fmt.Sprintf("127.0.0.1:%d", p0-1), "127.0.0.2:7400",
		fmt.Sprintf("127.0.0.1:%d", p2-1), "127.0.0.4:7400"))
	r2 := startProbe(t, fab.Host("r2", gid), append([]string{"--group-config", file, "--rank", "2", "--answer"}, args...))
	if want := fmt.Sprintf("127.0.0.1:%d", p2); len(r2.addrs) != 1 || r2.addrs[0] != want {
		t.Fatalf("rank 2 answers on %v, want %s", r2.addrs, want)
	}
	measure := func() (*probeReport, error) {
		o, err := parseProbe(append([]string{"--group-config", file, "--rank", "1", "--measure"}, args...), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = runProbe(context.Background(), o, fab.Host("r1", gid), "fake", &out)
		var rep probeReport
		if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
			t.Fatalf("report %q: %v", out.String(), jerr)
		}
		return &rep, err
	}
	rep, err := measure()
	if err != nil {
		t.Fatalf("measure: %v", err)
	}
	if len(rep.GroupLinks) != 2 || rep.GroupLinks[0].Peer != 0 || rep.GroupLinks[1].Peer != 2 {
		t.Fatalf("links %+v", rep.GroupLinks)
	}
	for _, pl := range rep.GroupLinks {
		if len(pl.Measured) != 1 || pl.Err != "" || pl.Profile == nil {
			t.Fatalf("link to rank %d: %+v", pl.Peer, pl)
		}
		m, p := pl.Measured[0], pl.Profile
		if m.Frames != 8 || m.BadFrames != 0 || m.Bytes != 2<<20 || m.Peer != pl.Address ||
			p.RTTUS != m.RTTP50us || p.GBps != m.GBps || p.SlotSize != 32<<10 || p.RTTUS <= 0 || p.GBps <= 0 {
			t.Errorf("link to rank %d: measured %+v, profile %+v", pl.Peer, m, p)
		}
	}
	a, b := rep.GroupLinks[0].Profile, rep.GroupLinks[1].Profile
	if w := rep.Profile; w == nil || w.RTTUS != max(a.RTTUS, b.RTTUS) || w.GBps != min(a.GBps, b.GBps) {
		t.Errorf("worst profile %+v of %+v and %+v", w, a, b)
	}
	r2.stop(t)
	rep, err = measure()
	if err == nil || !strings.Contains(err.Error(), "link to rank 2 (ring next)") || !strings.Contains(err.Error(), "unreachable") ||
		strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("measure with rank 2 gone: %v", err)
	}
	if l0, l2 := rep.GroupLinks[0], rep.GroupLinks[1]; l0.Profile == nil || l0.Err != "" || l2.Err == "" || l2.Profile != nil ||
		rep.Profile == nil || *rep.Profile != *l0.Profile {
		t.Errorf("with rank 2 gone: %+v, %+v, worst %+v", l0, l2, rep.Profile)
	}
}

// probeListener is an answering rdma-probe in the background.
type probeListener struct {
	addrs  []string
	cancel context.CancelFunc
	done   chan error
}

// startProbe runs rdma-probe with args until the test ends, returning once
// it reports the addresses it answers on.
func startProbe(t *testing.T, p verbs.Provider, args []string) *probeListener {
	t.Helper()
	o, err := parseProbe(args, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pl := &probeListener{cancel: cancel, done: make(chan error, 1)}
	out := &syncWriter{ch: make(chan []byte, 1)}
	go func() { pl.done <- runProbe(ctx, o, p, "fake", out) }()
	t.Cleanup(func() { pl.stop(t) })
	select {
	case b := <-out.ch:
		var rep probeReport
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		pl.addrs = rep.Listening
	case err := <-pl.done:
		t.Fatalf("rdma-probe %v: %v", args, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("rdma-probe %v reported nothing", args)
	}
	return pl
}

// stop ends the listener and waits until it has.
func (pl *probeListener) stop(t *testing.T) {
	if pl.cancel == nil {
		return
	}
	pl.cancel()
	pl.cancel = nil
	if err := <-pl.done; err != nil {
		t.Errorf("listener: %v", err)
	}
}
