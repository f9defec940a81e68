package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/kvtransfer/faultproxy"
)

// TestSubmitStreamsOnAfterAnOutage runs `coordinator submit` as a process
// of its own, through a TCP proxy, against an embedded NATS server and a
// stand-in coordinator that publishes the job's tokens as the test says.
// Ten tokens stream; the proxy cuts the client off and swallows its
// reconnections while ten more are published (lost to it); once it is
// back, the next tokens are printed as they arrive, before the job ends
// (the client once printed nothing more until the final event), and at
// the end the whole output follows, taken from the final event.
func TestSubmitStreamsOnAfterAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a client process")
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	co, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)

	// The stand-in coordinator: accepts the submission, knows no final
	// event when asked (list).
	jobs := make(chan string, 1)
	if _, err := co.Subscribe(cp.SubjectAllSubmit, func(m *nats.Msg) {
		var req cp.SubmitRequest
		enc, err := cp.DecodeMsg(m, &req)
		if err != nil {
			t.Errorf("submission: %v", err)
			return
		}
		id := cp.JobIDForKey(cp.DefaultClient, req.IdempotencyKey)
		if err := cp.Respond(m, enc, &cp.SubmitReply{JobID: id}); err != nil {
			t.Errorf("answer: %v", err)
		}
		select {
		case jobs <- id:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := co.Subscribe(cp.SubjectAllList, func(m *nats.Msg) {
		var req cp.ListJobsRequest
		enc, _ := cp.DecodeMsg(m, &req)
		_ = cp.Respond(m, enc, &cp.ListJobsReply{})
	}); err != nil {
		t.Fatal(err)
	}
	if err := co.Flush(); err != nil {
		t.Fatal(err)
	}
	base := ns.NumClients()

	proxy, err := faultproxy.Start(faultproxy.Config{Target: strings.TrimPrefix(ns.ClientURL(), "nats://")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })

	const n = 40
	cmd := exec.Command(os.Args[0], "submit", "--nats-url", "nats://"+proxy.Addr(), "--ids", "1,2,3", "--max-tokens", fmt.Sprint(n))
	cmd.Env = append(os.Environ(), childEnv+"=1", "HOME="+t.TempDir())
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("submit's stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		}
	})

	var id string
	select {
	case id = <-jobs:
	case err := <-exited:
		t.Fatalf("submit exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no submission")
	}
	seq := uint64(0)
	event := func(state cp.JobState, out *cp.Output) {
		seq++
		ev := cp.JobEvent{JobID: id, Seq: seq, State: state, Time: time.Now(), Submitted: time.Now()}
		if state.Final() {
			ev.Timing = &cp.Timing{FirstToken: time.Millisecond, Decode: time.Millisecond}
			ev.Output = out
		}
		if err := cp.Publish(co, cp.ClientJobEvents(cp.DefaultClient, id), &ev); err != nil {
			t.Fatal(err)
		}
	}
	token := func(i int) {
		m := cp.TokenMsg{JobID: id, Index: i, TokenID: int32(100 + i)}
		if i == n-1 {
			m.Final, m.FinishReason = true, cp.FinishLength
		}
		if err := cp.Publish(co, cp.ClientJobTokens(cp.DefaultClient, id), &m); err != nil {
			t.Fatal(err)
		}
	}
	// printed waits until the client printed token i.
	printed := func(i int) {
		t.Helper()
		want := fmt.Sprintf("%d ", 100+i)
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stdout.String(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the client did not print token %d (%d)", i, 100+i)
			}
		}
	}
	// clients waits until the server has n connections besides the
	// stand-in coordinator's.
	clients := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ns.NumClients() != base+n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the server has %d client connections, want %d", ns.NumClients()-base, n)
			}
		}
	}

	event(cp.StateQueued, nil)
	event(cp.StateDecoding, nil)
	for i := range 10 {
		token(i)
	}
	printed(9)

	// The outage: the client's connection is cut and its reconnections
	// swallowed while tokens 10..19 are published.
	proxy.SetFaults(faultproxy.Faults{Silent: true})
	proxy.CutAll()
	clients(0)
	for i := 10; i < 20; i++ {
		token(i)
	}
	if err := co.Flush(); err != nil {
		t.Fatal(err)
	}
	proxy.SetFaults(faultproxy.Faults{})
	// Back: connected, its subscriptions restored.
	clients(1)
	acc := ns.GlobalAccount()
	for deadline := time.Now().Add(30 * time.Second); acc.Interest(cp.ClientJobTokens(cp.DefaultClient, id)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client did not subscribe again")
		}
	}
	// The promise: what is published now is streamed now.
	token(20)
	printed(20)
	if strings.Contains(stdout.String(), "110 ") {
		t.Fatalf("the client printed a token published while it was cut off, before the end:\n%s", stdout.String())
	}
	for i := 21; i < n; i++ {
		token(i)
	}
	printed(n - 1)
	all := make([]int32, n)
	for i := range all {
		all[i] = int32(100 + i)
	}
	event(cp.StateDone, &cp.Output{TokenIDs: all, FinishReason: cp.FinishLength})
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("submit did not end after the final event")
	}
	if !strings.Contains(stderr.String(), "10 tokens missed; the stream goes on") {
		t.Fatalf("stderr does not tell of the gap:\n%s", stderr.String())
	}
	// The whole output follows the stream: it ends with every token.
	var whole strings.Builder
	for _, id := range all {
		fmt.Fprintf(&whole, "%d ", id)
	}
	if !strings.Contains(stdout.String(), whole.String()) {
		t.Fatalf("stdout lacks the whole output %q:\n%s", whole.String(), stdout.String())
	}
}
