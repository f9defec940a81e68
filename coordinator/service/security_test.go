package service_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// intruder is a NATS connection of an identity that misbehaves: it
// records what it receives and the server's permission refusals.
type intruder struct {
	nc   *nats.Conn
	mu   sync.Mutex
	got  []*nats.Msg
	errs []string
	errc chan struct{}
}

func connectIntruder(t *testing.T, url string, id *cp.Identity) *intruder {
	t.Helper()
	in := &intruder{errc: make(chan struct{}, 1)}
	nc, err := nats.Connect(url, nats.UserInfo(id.User, id.Password), nats.CustomInboxPrefix(cp.InboxPrefix(id.Principal, id.Name)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			in.mu.Lock()
			in.errs = append(in.errs, err.Error())
			in.mu.Unlock()
			select {
			case in.errc <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect as %s: %v", id.User, err)
	}
	t.Cleanup(nc.Close)
	in.nc = nc
	return in
}

// snoop subscribes to subject, recording every message.
func (in *intruder) snoop(t *testing.T, subject string) {
	t.Helper()
	if _, err := in.nc.Subscribe(subject, func(m *nats.Msg) {
		in.mu.Lock()
		in.got = append(in.got, m)
		in.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
}

// refused waits until the server has refused what on subject (a
// "subscription" or a "publish"): the positive sign that it was stopped.
func (in *intruder) refused(t *testing.T, what, subject string) {
	t.Helper()
	want := strings.ToLower(fmt.Sprintf("permissions violation for %s to %q", what, subject))
	deadline := time.After(10 * time.Second)
	for {
		in.mu.Lock()
		found := slices.ContainsFunc(in.errs, func(e string) bool { return strings.Contains(strings.ToLower(e), want) })
		errs := slices.Clone(in.errs)
		in.mu.Unlock()
		if found {
			return
		}
		select {
		case <-in.errc:
		case <-deadline:
			t.Fatalf("the server did not refuse the %s to %s: errors %q", what, subject, errs)
		}
	}
}

func (in *intruder) received() []*nats.Msg {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.got)
}

// TestClientsCannotReadOrForgeOthersJobs: with the embedded server and with
// a real nats-server configured by cp.ServerAuthorization, another client
// (mallory) and a rogue worker identity attack a running remote job of the
// client "local": mallory snoops on every subject, forges the job's
// progress, tokens and cancellation; the rogue worker forges progress in
// the names of the job's workers. The prefill worker logs in with its own
// named identity, the decode ranks with the shared one. The server refuses
// what the permissions forbid, the coordinator ignores (and logs) the
// rest, and the victim's job ends done with the monolithic model's tokens.
// Mallory receives nothing: no event, no token, no assignment with its
// transfer secret.
func TestClientsCannotReadOrForgeOthersJobs(t *testing.T) {
	for _, kind := range []string{"embedded", "process"} {
		t.Run(kind, func(t *testing.T) {
			// The prefill worker has its own identity, limited to its
			// worker id; the decode ranks share the worker identity.
			ids := append(cp.NewIdentities(), cp.NewIdentity(cp.PrincipalClient, "mallory"), cp.NewIdentity(cp.PrincipalWorker, "rogue"),
				cp.NewIdentity(cp.PrincipalWorker, "prefill-0"))
			opt := testOptions(t)
			opt.Identities = ids
			if kind == "process" {
				opt.NATSURL, _ = secureProcess(t, ids)
			}
			core, logs := observer.New(zapcore.WarnLevel)
			opt.Coordinator.Log = zap.New(zapcore.NewTee(core, testkit.Logger(t).Core()))
			c := startCluster(t, opt)
			ref := testmodel.LoadReference(t, opt.ModelDir, 1)
			mallory := connectIntruder(t, c.URL, &ids[3])
			rogue := connectIntruder(t, c.URL, &ids[4])

			// Unauthenticated and wrongly authenticated connections are refused.
			for _, o := range [][]nats.Option{nil, {nats.UserInfo(ids[2].User, "not-the-password-0000")}} {
				if nc, err := nats.Connect(c.URL, o...); err == nil {
					nc.Close()
					t.Fatal("connected without valid credentials")
				} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
					t.Fatalf("refusal %v does not say why", err)
				}
			}

			// Mallory listens everywhere she can name; the server refuses
			// every subscription beyond her own jobs and her own inbox
			// (which gets the replies to her own requests only).
			forbidden := []string{">", "tandem.>", "tandem.v1.clients.local.>", "tandem.v1.clients.*.jobs.>",
				"tandem.v1.workers.>", "_INBOX.>", "$KV.>", "$JS.>", cp.SubjectAllProgress}
			for _, s := range forbidden {
				mallory.snoop(t, s)
			}
			mallory.snoop(t, cp.ClientPrefix("mallory")+".jobs.>")
			for _, s := range forbidden {
				mallory.refused(t, "subscription", s)
			}
			// A named worker reads only its own assignments.
			rogue.snoop(t, cp.WorkerAssign(c.RankID(0)))
			rogue.refused(t, "subscription", cp.WorkerAssign(c.RankID(0)))

			victim := connect(t, c)
			long := testkit.Prompt(300, c.Model.VocabSize, 7)
			const n = 160
			decoding := make(chan string, 1)
			var finished sync.WaitGroup
			var res *client.Result
			var runErr error
			var endedAt time.Time
			finished.Add(1)
			go func() {
				defer finished.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				res, runErr = client.Run(ctx, victim, cp.SubmitRequest{TokenIDs: long, Sampling: cp.Sampling{MaxTokens: n}, Policy: cp.PolicyRemote},
					client.Handlers{Event: func(ev cp.JobEvent) {
						if ev.State == cp.StateDecoding {
							select {
							case decoding <- ev.JobID:
							default:
							}
						}
						if ev.State.Final() {
							endedAt = time.Now()
						}
					}})
			}()
			var job string
			select {
			case job = <-decoding:
			case <-time.After(2 * time.Minute):
				t.Fatal("the victim's job never decoded")
			}

			// Forgeries while the job decodes.
			forged := func(p cp.Progress) []byte {
				b, err := cp.Marshal(cp.MsgPack, &p)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			done := cp.Progress{JobID: job, WorkerID: c.RankID(0), Stage: cp.StateDone, Time: time.Now(), Tokens: 1}
			failed := cp.Progress{JobID: job, WorkerID: "prefill-0", Stage: cp.StateFailed, Time: time.Now(),
				Error: &cp.JobError{Code: cp.CodeInternal, Message: "forged"}}
			token, err := cp.Marshal(cp.MsgPack, &cp.TokenMsg{JobID: job, Index: 1, TokenID: 3, Text: "FORGED", Final: true, FinishReason: cp.FinishStop})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []struct {
				in      *intruder
				subject string
				data    []byte
			}{
				{mallory, cp.WorkerProgress(c.RankID(0), job), forged(done)},
				{mallory, cp.WorkerProgress("prefill-0", job), forged(failed)},
				{mallory, cp.ClientJobTokens(cp.DefaultClient, job), token},
				{mallory, cp.ClientJobEvents(cp.DefaultClient, job), token},
				{rogue, cp.WorkerProgress(c.RankID(0), job), forged(done)},
				{rogue, cp.ClientJobEvents(cp.DefaultClient, job), token},
				{rogue, cp.ClientCancel(cp.DefaultClient), []byte{0x80}},
			} {
				if err := f.in.nc.Publish(f.subject, f.data); err != nil {
					t.Fatal(err)
				}
				f.in.refused(t, "publish", f.subject)
			}
			// Mallory's cancellation on her own subject: as if the job did
			// not exist.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := cp.Cancel(ctx, mallory.nc, job, "mallory wants it gone"); err == nil || !strings.Contains(err.Error(), string(cp.CodeNotFound)) {
				t.Fatalf("cancel of another client's job: %v, want not_found", err)
			}
			// The rogue worker may report under its own subject only, and
			// the coordinator takes no report of a worker not holding the
			// job, nor one whose subject names another worker.
			for _, p := range []cp.Progress{{JobID: job, WorkerID: c.RankID(0), Stage: cp.StateDone, Time: time.Now()},
				{JobID: job, WorkerID: "rogue", Stage: cp.StateFailed, Time: time.Now(), Error: &cp.JobError{Message: "forged"}}} {
				if err := rogue.nc.Publish(cp.WorkerProgress("rogue", job), forged(p)); err != nil {
					t.Fatal(err)
				}
			}
			for _, want := range []string{"its subject names another worker or job", "the worker does not hold the job"} {
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if logs.FilterMessageSnippet(want).Len() > 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the coordinator did not log %q", want)
					}
				}
			}
			ignoredAt := time.Now()

			finished.Wait()
			if runErr != nil {
				t.Fatal(runErr)
			}
			if !endedAt.After(ignoredAt) {
				t.Fatalf("the job ended at %v, before every forgery was handled (%v): make it longer", endedAt, ignoredAt)
			}
			if res.Final.State != cp.StateDone || !slices.Equal(res.Tokens, ref.Greedy(t, long, n)) || strings.Contains(res.Text, "FORGED") {
				t.Fatalf("the victim's job: %s, %d tokens (finish %s), want done with the reference's %d", res.Final.State, len(res.Tokens), res.Finish, n)
			}
			// Settled: the job is over and a round trip on mallory's
			// connection delivered whatever was on its way.
			if err := mallory.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := mallory.received(); len(got) > 0 {
				t.Fatalf("mallory received %d messages, e.g. on %s", len(got), got[0].Subject)
			}
			lctx, lcancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer lcancel()
			list, err := cp.ListJobs(lctx, mallory.nc, &cp.ListJobsRequest{})
			if err != nil || len(list.Jobs) != 0 {
				t.Fatalf("mallory's job list: %+v, %v; want empty", list, err)
			}
			mine, err := cp.ListJobs(lctx, victim, &cp.ListJobsRequest{})
			if err != nil || len(mine.Jobs) != 1 || mine.Jobs[0].JobID != job {
				t.Fatalf("the victim's job list: %+v, %v", mine, err)
			}
		})
	}
}
