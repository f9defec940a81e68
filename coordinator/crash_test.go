package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cli"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/syncbuf"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
)

// These tests run the coordinator as a process of its own (the test
// binary, re-executed as the coordinator command) so that it can be killed
// with SIGKILL mid-job; the workers and the clients run in the test, on
// their own NATS connections, as other machines would.

// childEnv makes the test binary run as the coordinator command.
const childEnv = "TANDEM_COORDINATOR_CHILD"

func TestMain(m *testing.M) {
	testkit.Child(childEnv, func(ctx context.Context, args []string) int { return cli.Execute(ctx, args, os.Stdout, os.Stderr) })
	testkit.Main(m)
}

type syncBuffer = syncbuf.Buffer

// coordinator is a coordinator process.
type coordinator struct {
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
}

// Timings short enough for a test: a job whose coordinator died is
// delivered again 2 s after its last sign of life; workers beat every
// second.
var serveFlags = []string{"--queue-ack-wait", "2s", "--registry-ttl", "3s", "--timeouts-assign", "10s",
	"--timeouts-placement", "60s", "--timeouts-stall", "30s", "--metrics-listen", "", "--http-listen", "", "--log-format", "json",
	"--router-pass-floor", "20ms", "--router-prefill-tok-s", "3000", "--router-local-prefill-tok-s", "2500",
	"--router-decode-step", "2ms"}

func startCoordinator(t *testing.T, args ...string) *coordinator {
	t.Helper()
	return startChild(t, "coordinator serving", append(append([]string{"serve"}, serveFlags...), args...)...)
}

// startChild runs the coordinator command with args as a process of its
// own and returns once its log has the line ready.
func startChild(t *testing.T, ready string, args ...string) *coordinator {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	c := &coordinator{cmd: cmd, log: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("coordinator %d log:\n%s", cmd.Process.Pid, tail(c.log.String(), 60))
		}
	})
	deadline := time.After(60 * time.Second)
	for !strings.Contains(c.log.String(), ready) {
		select {
		case <-c.done:
			t.Fatalf("%s exited:\n%s", args[0], c.log.String())
		case <-deadline:
			t.Fatalf("%s: no %q after 60s:\n%s", args[0], ready, c.log.String())
		case <-time.After(20 * time.Millisecond): // polling its log for the line
		}
	}
	return c
}

// kill stops the coordinator as a crash would: SIGKILL, nothing handed
// back.
func (c *coordinator) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	return strings.Join(ls[max(len(ls)-lines, 0):], "\n")
}

// credentials writes a deployment's identities (coordinator, worker,
// client) into a private directory, as the first `coordinator serve`
// would, and returns the directory and the identities.
func credentials(t *testing.T) (string, []cp.Identity) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "creds")
	ids, err := cp.EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, ids
}

// connectAs connects to url as the identity of principal p among ids,
// reconnecting forever (and waiting for a server that is down).
func connectAs(ctx context.Context, url string, ids []cp.Identity, p cp.Principal, name string) (*nats.Conn, error) {
	return cp.Connect(ctx, cp.Options{URL: url, Name: name, Identity: cp.Find(ids, p), MaxReconnects: -1,
		ReconnectWait: 100 * time.Millisecond, RetryConnect: true})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startWorkers starts a prefill worker and a 2-rank decode group on url,
// logged in with ids, registered with a TTL of ttl.
func startWorkers(t *testing.T, dir, url string, ids []cp.Identity, replicas int, ttl time.Duration) *cluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, NATSURL: url, NoCoordinator: true, Threads: 1, Identities: ids,
		Registry:      cp.RegistryConfig{TTL: ttl, Replicas: replicas},
		MeshHeartbeat: 100 * time.Millisecond, MeshIdle: 5 * time.Second,
		Transfer: kvtransfer.Timeouts{Handshake: 5 * time.Second, IO: 10 * time.Second, Idle: 10 * time.Second,
			KeepAlive: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// job is one client following its job.
type job struct {
	req      cp.SubmitRequest
	want     []int32
	decoding chan struct{} // closed when the client saw the decoding event
	queued   chan struct{} // closed when the client saw the queued event
	res      *client.Result
	err      error
	done     chan struct{}
}

// follow runs a client for req on its own connection to url, as the
// client identity among ids.
func follow(t *testing.T, url string, ids []cp.Identity, req cp.SubmitRequest, want []int32) *job {
	t.Helper()
	j := &job{req: req, want: want, decoding: make(chan struct{}), queued: make(chan struct{}), done: make(chan struct{})}
	var once, qonce sync.Once
	go func() {
		defer close(j.done)
		// A client started while the coordinator is down waits for it.
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		nc, err := connectAs(cctx, url, ids, cp.PrincipalClient, "client")
		if err != nil {
			j.err = err
			return
		}
		defer nc.Close()
		rctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		j.res, j.err = client.Run(rctx, nc, req, client.Handlers{Event: func(ev cp.JobEvent) {
			switch ev.State {
			case cp.StateQueued:
				qonce.Do(func() { close(j.queued) })
			case cp.StateDecoding, cp.StateDone:
				once.Do(func() { close(j.decoding) })
			}
		}})
	}()
	return j
}

// check waits for the client and checks that its job ended done with the
// monolithic model's tokens.
func (j *job) check(t *testing.T) {
	t.Helper()
	<-j.done
	if j.err != nil {
		t.Fatalf("client: %v", j.err)
	}
	if err := j.res.Err(); err != nil {
		t.Fatal(err)
	}
	if j.res.Final.State != cp.StateDone {
		t.Fatalf("job %s ended %s: %+v", j.res.JobID, j.res.Final.State, j.res.Final)
	}
	if !slices.Equal(j.res.Tokens, j.want) {
		t.Fatalf("job %s: tokens\n got %v\nwant %v (monolithic model)", j.res.JobID, j.res.Tokens, j.want)
	}
}

// settled waits until the queue holds no job (each was acknowledged at
// its end: nothing can run again), the decode group holds no sequence and
// the prefill worker no job: the positive sign that the system is at
// rest.
func settled(t *testing.T, url string, ids []cp.Identity, c *cluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := connectAs(ctx, url, ids, cp.PrincipalCoordinator, "settle")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for {
		var stored uint64 = 1
		if s, err := js.Stream(ctx, cp.JobsStream); err == nil {
			if si, err := s.Info(ctx); err == nil {
				stored = si.State.Msgs
			}
		}
		hs := c.Group.Head().Stats()
		ps := c.PrefillWorker().Stats()
		if stored == 0 && hs.Sequences == 0 && ps.Queued == 0 && ps.InProgress == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not settled: %d jobs stored, %d sequences on the decode group, prefill %+v", stored, hs.Sequences, ps)
		case <-time.After(50 * time.Millisecond): // polling the counters with a deadline
		}
	}
}

// ranOnce checks the workers' counters: every job admitted once by the
// decode group and every remote one prefilled once.
func ranOnce(t *testing.T, c *cluster.Cluster, jobs []*job) {
	t.Helper()
	// A job that asked for the remote path counts whatever its final
	// route says: adopted while its prefill worker was reconnecting (it
	// did not answer the coordinator's inquiry), its route cannot name it.
	remote := 0
	for _, j := range jobs {
		if j.req.Policy == cp.PolicyRemote || j.res.Final.Route != nil && j.res.Final.Route.Target == cp.TargetRemote {
			remote++
		}
	}
	hs := c.Group.Head().Stats()
	ps := c.PrefillWorker().Stats()
	if hs.Admitted != int64(len(jobs)) || hs.Finished != int64(len(jobs)) || hs.Failed != 0 {
		t.Errorf("decode group: %d admitted, %d finished, %d failed; want each of the %d jobs admitted and finished once",
			hs.Admitted, hs.Finished, hs.Failed, len(jobs))
	}
	if ps.Completed != remote || ps.Failed != 0 || ps.Cancelled != 0 {
		t.Errorf("prefill worker: %d completed, %d failed, %d cancelled; want the %d remote jobs prefilled once",
			ps.Completed, ps.Failed, ps.Cancelled, remote)
	}
}

// adopted counts the jobs whose final event comes from a coordinator that
// took them over (the detail says so).
func adopted(jobs []*job) int {
	n := 0
	for _, j := range jobs {
		if strings.Contains(j.res.Final.Detail, "adopted") {
			n++
		}
	}
	return n
}

// TestKill9DuringRunningJobs: the coordinator (with its embedded NATS
// server) is killed with SIGKILL while short and long jobs decode, and
// restarted on the same data directory. Each job runs exactly once (the
// decode group admits each once, the prefill worker prefills each remote
// one once), every client ends with the monolithic model's tokens, and a
// job that ended while no coordinator was up is reported, not run again.
func TestKill9DuringRunningJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a coordinator process: not in -short")
	}
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	port, data := freePort(t), t.TempDir()
	creds, ids := credentials(t)
	args := []string{"--model", dir, "--embedded-port", fmt.Sprint(port), "--embedded-data-dir", data, "--embedded-credentials-dir", creds}
	co := startCoordinator(t, args...)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	c := startWorkers(t, dir, url, ids, 1, 3*time.Second)

	type spec struct {
		n, out int
		policy cp.Policy
	}
	// Long jobs first, still decoding after the restart; then short ones,
	// over while no coordinator is up (their end is unobserved).
	long := []spec{{8, 300, cp.PolicyLocal}, {280, 300, cp.PolicyRemote}}
	short := []spec{{7, 30, cp.PolicyLocal}, {9, 30, cp.PolicyLocal}, {250, 30, cp.PolicyRemote}}
	reqs := func(specs []spec, seed int) (out []cp.SubmitRequest, wants [][]int32) {
		for i, sp := range specs {
			p := testkit.Prompt(sp.n, 256, seed+i)
			out = append(out, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: sp.out}, Policy: sp.policy})
			wants = append(wants, ref.Greedy(t, p, sp.out))
		}
		return out, wants
	}
	longReqs, longWants := reqs(long, 1)
	shortReqs, shortWants := reqs(short, 10)
	var jobs []*job
	start := func(rs []cp.SubmitRequest, ws [][]int32) {
		var started []*job
		for i := range rs {
			started = append(started, follow(t, url, ids, rs[i], ws[i]))
		}
		for _, j := range started {
			<-j.decoding
		}
		jobs = append(jobs, started...)
	}
	start(longReqs, longWants)
	start(shortReqs, shortWants)
	co.kill()
	startCoordinator(t, args...)
	for _, j := range jobs {
		j.check(t)
	}
	settled(t, url, ids, c)
	ranOnce(t, c, jobs)
	t.Logf("%d of %d jobs reported by the restarted coordinator as adopted", adopted(jobs), len(jobs))
	if adopted(jobs) == 0 {
		t.Fatal("no job was adopted: the kill did not hit running jobs")
	}
}

// Test50ClientsSurviveCoordinatorDowntime: 40 clients follow jobs when the
// coordinator (and its embedded NATS server) is killed; it stays down for
// 10 s, during which 10 more clients start; all 50 reconnect, resubmit or
// resume by job id, and see their jobs finish with the right tokens, each
// job run once.
func Test50ClientsSurviveCoordinatorDowntime(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a coordinator process: not in -short")
	}
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	port, data := freePort(t), t.TempDir()
	creds, ids := credentials(t)
	args := []string{"--model", dir, "--embedded-port", fmt.Sprint(port), "--embedded-data-dir", data, "--embedded-credentials-dir", creds}
	co := startCoordinator(t, args...)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	c := startWorkers(t, dir, url, ids, 1, 3*time.Second)

	prompts := make([][]int32, 5)
	wants := make([][]int32, 5)
	for i := range prompts {
		prompts[i] = testkit.Prompt(5+i*3, 256, 100+i)
		wants[i] = ref.Greedy(t, prompts[i], 40)
	}
	submit := func(i int) *job {
		return follow(t, url, ids, cp.SubmitRequest{TokenIDs: prompts[i%5], Sampling: cp.Sampling{MaxTokens: 40}, Policy: cp.PolicyLocal}, wants[i%5])
	}
	var jobs []*job
	for i := range 40 {
		jobs = append(jobs, submit(i))
	}
	for _, j := range jobs {
		<-j.queued // accepted by the coordinator before it dies
	}
	co.kill()
	for i := range 10 {
		jobs = append(jobs, submit(40+i))
	}
	time.Sleep(10 * time.Second) // the fault: the coordinator is down this long
	startCoordinator(t, args...)
	for _, j := range jobs {
		j.check(t)
	}
	settled(t, url, ids, c)
	ranOnce(t, c, jobs)
	recovered := 0
	for _, j := range jobs {
		if j.res.Recovered {
			recovered++
		}
	}
	t.Logf("%d jobs adopted, %d clients took missed tokens from the final event", adopted(jobs), recovered)
}

// TestScaledOutControlPlane: three nats-server processes clustered on
// loopback hold the queue, the registry and the results with three
// replicas; two coordinators share them. Under a load of jobs one server
// and one coordinator are killed with SIGKILL: no job is lost, none runs
// twice, every client sees its job finish.
func TestScaledOutControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nats-server and two coordinator processes: not in -short")
	}
	// A progress report published through the server being killed, or
	// while the surviving coordinator reconnects, is lost (core NATS):
	// the coordinator asks the decode group how the job stands after its
	// reconnection and before it fails a silent job (jobrun's Check).
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	creds, ids := credentials(t)
	auth, err := cp.ServerAuthorization(ids)
	if err != nil {
		t.Fatal(err)
	}
	coord := cp.Find(ids, cp.PrincipalCoordinator)
	servers := natstest.Cluster(t, 3, auth, nats.UserInfo(coord.User, coord.Password))
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.URL)
	}
	all := strings.Join(urls, ",")
	// A registry TTL longer than a failover: while the replicated buckets
	// elect new leaders after the server dies, heartbeats wait. A
	// follower calls an election 4-9 s after its leader went silent
	// (nats-server's raft election timeout), and a worker beats every
	// TTL/3: with 10 s, live workers were declared dead (1 run in 5 under
	// load) and their jobs failed.
	replicated := []string{"--model", dir, "--nats-url", all, "--nats-credentials", cp.IdentityFile(creds, cp.PrincipalCoordinator), "--queue-replicas", "3", "--registry-replicas", "3", "--registry-ttl", "20s"}
	co1 := startCoordinator(t, replicated...)
	startCoordinator(t, replicated...)
	c := startWorkers(t, dir, all, ids, 3, 20*time.Second)

	var jobs []*job
	for i := range 24 {
		n, policy := 6+i%7, cp.PolicyLocal
		if i%4 == 3 {
			n, policy = 200+i, cp.PolicyRemote
		}
		p := testkit.Prompt(n, 256, 200+i)
		// Each client on one server, so that some lose theirs.
		jobs = append(jobs, follow(t, urls[i%3], ids, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 200}, Policy: policy},
			ref.Greedy(t, p, 200)))
	}
	// Kill when a third of the jobs decode, the others queued or running.
	for _, j := range jobs[:8] {
		select {
		case <-j.decoding:
		case <-j.done:
		}
	}
	servers[1].Kill()
	co1.kill()
	for _, j := range jobs {
		j.check(t)
	}
	settled(t, urls[0], ids, c)
	ranOnce(t, c, jobs)
	t.Logf("%d of %d jobs adopted by the surviving coordinator", adopted(jobs), len(jobs))
}
