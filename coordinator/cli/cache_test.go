package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/heldbackend"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

// TestCacheCommands: `coordinator cache list|drop` against a deployment's
// real workers over NATS (a prefill worker with its prefix store, a decode
// group of two ranks with its cache). After a session's first turn every
// worker lists its entry with the model identity, the cache dtype and the
// prefix's hash (the chain link the router computes); dropping the prefill
// worker's entry by key makes the next turn miss there; dropping a decode
// rank's entries drops them on every rank of its group and the next turn
// of the group's own prefill misses; an entry dropped while a job runs
// from it (the pass held mid-way, the group's rows already restored) costs
// that job nothing. Every turn gives the monolithic model's greedy ids.
// Only the coordinator identity may send cache requests: the NATS server
// refuses a client's and a worker's; hostile requests are answered with a
// clear error and change nothing.
func TestCacheCommands(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	ctx := testctx.Context(t)
	held := heldbackend.New(cpu.New(1), 3, false)
	opt := cluster.Options{ModelDir: dir, Threads: 1,
		Queue:    cp.QueueConfig{Memory: true, AckWait: 3 * time.Second},
		Registry: cp.RegistryConfig{Memory: true, TTL: 2 * time.Second},
		Coordinator: service.Config{AssignTimeout: 10 * time.Second, PlacementWait: 10 * time.Second,
			StallTimeout: 30 * time.Second, ShutdownGrace: 2 * time.Second},
		MeshHeartbeat: 100 * time.Millisecond, MeshIdle: 2 * time.Second,
		Transfer: kvtransfer.Timeouts{Handshake: 2 * time.Second, IO: 10 * time.Second, Idle: 10 * time.Second,
			KeepAlive: 200 * time.Millisecond},
		PrefillBackend: func() kernels.Backend { return held }}
	opt.PrefixStore.Dir = t.TempDir()
	c, err := cluster.Start(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer held.Resume() // before the cluster closes, also when the test fails holding it
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	creds := t.TempDir()
	for _, p := range []cp.Principal{cp.PrincipalCoordinator, cp.PrincipalClient} {
		if err := cp.SaveIdentity(cp.IdentityFile(creds, p), cp.Find(c.Identities(), p)); err != nil {
			t.Fatal(err)
		}
	}
	natsArgs := []string{"--nats-url", c.URL, "--nats-credentials", cp.IdentityFile(creds, cp.PrincipalCoordinator)}
	cache := func(args ...string) (string, string, error) {
		return run(ctx, append(append([]string{"cache"}, args...), natsArgs...)...)
	}
	list := func() map[string]*cp.CacheReply {
		t.Helper()
		out, errw, err := cache("list", "--json")
		if err != nil {
			t.Fatalf("cache list --json: %v\n%s", err, errw)
		}
		var res cacheResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("cache list --json: %v\n%s", err, out)
		}
		m := map[string]*cp.CacheReply{}
		for _, r := range res.Workers {
			m[r.WorkerID] = r
		}
		return m
	}
	// await lists until cond holds: entries are kept as the workers
	// finish their part, which may come after the job's final event.
	await := func(what string, cond func(map[string]*cp.CacheReply) bool) map[string]*cp.CacheReply {
		t.Helper()
		// Entries settle within milliseconds of a job's end: two minutes
		// is a hang, reported with what the caches hold.
		actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		for {
			l := list()
			if cond(l) {
				return l
			}
			select {
			case <-actx.Done():
				b, _ := json.MarshalIndent(l, "", "  ")
				t.Fatalf("waiting for %s: the caches hold\n%s", what, b)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	counts := func(store, r0, r1 int) func(map[string]*cp.CacheReply) bool {
		return func(l map[string]*cp.CacheReply) bool {
			return l["prefill-0"] != nil && l["prefill-0"].Total == store && l["local-r0"] != nil && l["local-r0"].Total == r0 &&
				l["local-r1"] != nil && l["local-r1"].Total == r1
		}
	}
	nc, err := c.Connect(ctx, "test-client")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	vocab := c.Model.VocabSize
	salt := prefixkey.Salt(c.Model.ID, uint8(model.BF16))
	var p, out []int32
	turn := func(i int, more []int32, n int, policy cp.Policy, wantCached int, during func()) *client.Result {
		t.Helper()
		p = append(append(p, out...), more...)
		passing := make(chan struct{}) // the pass reported a layer
		var stepped bool
		h := client.Handlers{Event: func(ev cp.JobEvent) {
			if ev.State == cp.StatePrefilling && ev.Progress != nil && ev.Progress.Done > 0 && !stepped {
				stepped = true
				close(passing)
			}
		}}
		type result struct {
			res *client.Result
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: n}, Policy: policy}, h)
			done <- result{res, err}
		}()
		if during != nil {
			select {
			case <-passing:
			case r := <-done:
				t.Fatalf("turn %d ended before its pass reached the held layer: %+v %v", i, r.res, r.err)
			}
			during()
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("turn %d: %v", i, r.err)
		}
		res := r.res
		if err := res.Err(); err != nil || res.Final.State != cp.StateDone {
			t.Fatalf("turn %d: %s %v", i, res.Final.State, err)
		}
		if want := ref.Greedy(t, p, n); !slices.Equal(res.Tokens, want) {
			t.Fatalf("turn %d (%d tokens): ids %v, want %v (the monolithic model from scratch)", i, len(p), res.Tokens, want)
		}
		if got := res.Final.Timing.CachedTokens; got != wantCached {
			t.Fatalf("turn %d (%d tokens, %s): %d tokens from a cache (on %q), want %d", i, len(p), policy, got, res.Final.Timing.CachedOn, wantCached)
		}
		out = res.Tokens
		return res
	}

	// Nothing cached yet: every worker answers, with its identity.
	l := list()
	for _, w := range []string{"prefill-0", "local-r0", "local-r1"} {
		r := l[w]
		if r == nil || r.Total != 0 || r.Model != c.Model.ID || r.CacheDType != "bf16" || r.Off {
			t.Fatalf("%s before any job: %+v", w, r)
		}
	}
	if l["local-r1"].Kind != cp.KindDecode || l["local-r1"].GroupID != "local" || l["local-r1"].Rank != 1 || l["prefill-0"].Kind != cp.KindPrefill {
		t.Fatalf("who answered: %+v %+v", l["local-r1"], l["prefill-0"])
	}

	// Turn 1 (remote): the prefill worker keeps the first 128 tokens, the
	// group the same 128 (it prefills the rest itself).
	turn(1, testkit.Prompt(150, vocab, 1), 6, cp.PolicyRemote, 0, nil)
	l = await("turn 1's entries", counts(1, 1, 1))
	link := fmt.Sprintf("%016x", uint64(prefixkey.Chain(prefixkey.SHA256, salt, p[:128])[1]))
	for _, w := range []string{"prefill-0", "local-r0", "local-r1"} {
		e := l[w].Entries[0]
		if e.Tokens != 128 || e.Prefix != link || e.Bytes <= 0 || time.Since(e.LastUse) > 5*time.Minute || time.Until(e.LastUse) > time.Minute {
			t.Errorf("%s's entry %+v: want 128 tokens under prefix %s, bytes and a recent last use", w, e, link)
		}
	}
	if k0, k1 := l["local-r0"].Entries[0].Key, l["local-r1"].Entries[0].Key; k0 != k1 || l["local-r0"].Entries[0].Snapshots != 1 {
		t.Fatalf("the group's ranks list one entry under different keys %q, %q (or without its snapshot)", k0, k1)
	}
	storeKey := l["prefill-0"].Entries[0].Key
	text, _, err := cache("list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"WORKER", "prefill-0", "local-r0", "local r1", storeKey, link, c.Model.ID, "bf16", "128"} {
		if !strings.Contains(text, want) {
			t.Errorf("cache list does not show %q:\n%s", want, text)
		}
	}
	if text, _, err := cache("list", "local-r1"); err != nil || strings.Contains(text, "prefill-0") || !strings.Contains(text, link) {
		t.Errorf("cache list local-r1: %v\n%s", err, text)
	}

	// Only the coordinator identity reaches the cache subjects: the server
	// refuses a client's request and a worker's (which would list another
	// worker's prompts or empty its cache), and the entry stays.
	for _, who := range []struct {
		p    cp.Principal
		name string
	}{{cp.PrincipalClient, "mallory"}, {cp.PrincipalWorker, "rogue"}} {
		violations := make(chan string, 4)
		bad, err := c.ConnectAs(ctx, who.p, who.name)
		if err != nil {
			t.Fatal(err)
		}
		bad.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if strings.Contains(err.Error(), "Permissions Violation") {
				violations <- err.Error()
			}
		})
		short, stop := context.WithTimeout(ctx, 2*time.Second)
		if rep, err := cp.DropCache(short, bad, "prefill-0", ""); err == nil {
			t.Errorf("a %s dropped the prefill worker's cache: %+v", who.p, rep)
		}
		stop()
		select {
		case v := <-violations:
			if !strings.Contains(v, `"`+cp.WorkerCache("prefill-0")+`"`) {
				t.Errorf("%s: refusal %q does not name the cache subject", who.p, v)
			}
		case <-ctx.Done():
			t.Fatalf("the server did not refuse the %s's cache request", who.p)
		}
		bad.Close()
	}
	// Hostile and malformed requests: a clear error, nothing dropped.
	coord, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-coordinator")
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	for _, w := range []string{"prefill-0", "local-r0", "local-r1"} {
		if err := natstest.MalformedAnswered(ctx, coord, cp.WorkerCache(w)); err != nil {
			t.Error(err)
		}
		for body, want := range map[string]string{
			`{"worker_id":"` + w + `","op":"drop"}`:                                           "not neither",
			`{"worker_id":"` + w + `","op":"drop","key":"` + strings.Repeat("a", 5000) + `"}`: "key",
			`{"worker_id":"` + w + `","op":"purge","all":true}`:                               "op",
			`{"worker_id":"someone-else","op":"drop","all":true}`:                             "addressed to someone-else",
		} {
			m := nats.NewMsg(cp.WorkerCache(w))
			m.Header.Set(cp.HeaderContentType, cp.ContentTypeJSON)
			m.Data = []byte(body)
			rctx, stop := context.WithTimeout(ctx, 10*time.Second)
			r, err := coord.RequestMsgWithContext(rctx, m)
			stop()
			var rep cp.CacheReply
			if err == nil {
				err = cp.Unmarshal(cp.JSON, r.Data, &rep)
			}
			if err != nil || rep.Code != cp.CodeBadRequest || !strings.Contains(rep.Error, want) {
				t.Errorf("%s: %.80s: %+v %v; want a bad_request error naming %q", w, body, rep, err, want)
			}
		}
	}
	if _, errw, err := cache("drop", "local-r0", "not-a-number"); err == nil || !strings.Contains(err.Error(), "2 of 2 workers failed") ||
		!strings.Contains(errw, "error: local-r1:") || !strings.Contains(errw, "positive integers") {
		t.Errorf("drop of a decode entry by a non-numeric key: %v\n%s", err, errw)
	}
	if _, _, err := cache("drop", "prefill-0", "0000000000000000-64"); err == nil || !strings.Contains(err.Error(), "no entry") {
		t.Errorf("drop of an entry that is not there: %v", err)
	}
	if _, _, err := cache("list", "nosuchworker"); err == nil || !strings.Contains(err.Error(), "no worker") {
		t.Errorf("list of an unknown worker: %v", err)
	}
	if _, _, err := cache("drop", "prefill-0"); err == nil || !strings.Contains(err.Error(), "--all") {
		t.Errorf("drop without a key or --all: %v", err)
	}
	await("every entry still there", counts(1, 1, 1))

	// The prefill worker's entry, by key: the next turn misses there (the
	// group still appends to its 128 rows).
	text, errw, err := cache("drop", "prefill-0", storeKey)
	if err != nil || !strings.Contains(text, "prefill-0 (prefill): dropped 1, 0 entries") {
		t.Fatalf("cache drop prefill-0 %s: %v\n%s%s", storeKey, err, text, errw)
	}
	await("the store's entry gone", counts(0, 1, 1))
	appends := c.Group.Head().Stats().Cache.AppendTokens
	turn(2, testkit.Prompt(120, vocab, 2), 6, cp.PolicyRemote, 0, nil) // 276 tokens
	if got := c.Group.Head().Stats().Cache.AppendTokens - appends; got != 128 {
		t.Fatalf("turn 2: the group appended to %d tokens of its rows, want 128", got)
	}
	l = await("turn 2's entries", func(l map[string]*cp.CacheReply) bool {
		return counts(1, 1, 1)(l) && l["prefill-0"].Entries[0].Tokens == 256 && l["local-r0"].Entries[0].Tokens == 256
	})

	// The group's entry, named on rank 1: dropped on both ranks; the next
	// turn on the group's own prefill misses.
	key := l["local-r0"].Entries[0].Key
	text, errw, err = cache("drop", "local-r1", key, "--json")
	var dropped cacheResult
	if err != nil || json.Unmarshal([]byte(text), &dropped) != nil || len(dropped.Workers) != 2 || dropped.dropped() != 2 {
		t.Fatalf("cache drop local-r1 %s --json: %v\n%s%s", key, err, text, errw)
	}
	await("the group's entry gone from both ranks", counts(1, 0, 0))
	turn(3, testkit.Prompt(100, vocab, 3), 6, cp.PolicyLocal, 0, nil) // 382 tokens
	l = await("turn 3's entry on the group", counts(1, 1, 1))

	// Entries in use: turn 4 resumes from the store (its pass held at a
	// layer) and appends to the group's rows, restored at admission; every
	// entry of every worker is dropped meanwhile. The job is unharmed.
	held.Hold()
	var all string
	turn(4, testkit.Prompt(90, vocab, 4), 6, cp.PolicyRemote, 256, func() {
		all, errw, err = cache("drop", "--all")
		held.Resume()
		if err != nil {
			t.Errorf("cache drop --all: %v\n%s", err, errw)
		}
	})
	for _, want := range []string{"prefill-0 (prefill): dropped 1", "local-r0 (decode local r0): dropped 1", "local-r1 (decode local r1): dropped 1"} {
		if !strings.Contains(all, want) {
			t.Errorf("cache drop --all does not say %q:\n%s", want, all)
		}
	}
	// Turn 4 still keeps its state as an entry on both sides (what it
	// resumed from is gone, so it supersedes nothing), and the ranks agree.
	l = await("turn 4's entries", counts(1, 1, 1))
	keys := func(r *cp.CacheReply) []string {
		var ks []string
		for _, e := range r.Entries {
			ks = append(ks, e.Key)
		}
		slices.Sort(ks)
		return ks
	}
	if k0, k1 := keys(l["local-r0"]), keys(l["local-r1"]); !slices.Equal(k0, k1) {
		t.Fatalf("after the drop in use, rank 0 holds %v and rank 1 %v", k0, k1)
	}
	// And the session goes on, from the entries turn 4 left.
	turn(5, testkit.Prompt(70, vocab, 5), 6, cp.PolicyRemote, l["prefill-0"].Entries[0].Tokens, nil)

	// A worker that does not answer fails the command, after the others.
	c.KillPrefill()
	_, errw, err = cache("list")
	if err == nil || !strings.Contains(err.Error(), "1 of 3 workers failed") || !strings.Contains(errw, "error: prefill-0: it serves no cache requests") {
		t.Errorf("cache list with the prefill worker gone: %v\n%s", err, errw)
	}
}

// TestCacheTargets: a drop named on a decode rank goes to every rank of
// its group and nowhere else; a list of a rank other than the head also
// asks its head (for the prefixes) unless it is listed; unknown workers
// are errors; the arguments must name an entry or say --all.
func TestCacheTargets(t *testing.T) {
	ws := []cp.WorkerInfo{{ID: "gpu-0", Kind: cp.KindPrefill}, {ID: "a-r1", Kind: cp.KindDecode, GroupID: "a", Rank: 1},
		{ID: "a-r0", Kind: cp.KindDecode, GroupID: "a"}, {ID: "b-r0", Kind: cp.KindDecode, GroupID: "b"}, {ID: "b-r1", Kind: cp.KindDecode, GroupID: "b", Rank: 1}}
	for _, tc := range []struct {
		worker string
		want   []string
	}{
		{"", []string{"a-r0", "a-r1", "b-r0", "b-r1", "gpu-0"}},
		{"gpu-0", []string{"gpu-0"}},
		{"a-r1", []string{"a-r0", "a-r1"}},
		{"b-r0", []string{"b-r0", "b-r1"}},
	} {
		if got, err := dropTargets(ws, tc.worker); err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("dropTargets(%q) = %v, %v; want %v", tc.worker, got, err, tc.want)
		}
	}
	if _, err := dropTargets(ws, "c-r0"); err == nil || !strings.Contains(err.Error(), `no worker "c-r0"`) {
		t.Errorf("dropTargets of an unknown worker: %v", err)
	}
	if got, err := listTargets(ws, []string{"b-r1", "a-r1", "b-r1"}); err != nil || !slices.Equal(got, []string{"a-r1", "b-r1"}) {
		t.Errorf("listTargets = %v, %v", got, err)
	}
	if got := headsOf(ws, []string{"a-r1", "b-r1", "b-r0", "gpu-0"}); !slices.Equal(got, []string{"a-r0"}) {
		t.Errorf("headsOf = %v, want [a-r0]", got)
	}
	reps := []*cp.CacheReply{{WorkerID: "a-r1", Kind: cp.KindDecode, GroupID: "a", Rank: 1, Entries: []cp.CacheEntry{{Key: "3"}, {Key: "4"}}}}
	fillPrefixes(reps, []*cp.CacheReply{{WorkerID: "a-r0", Kind: cp.KindDecode, GroupID: "a", Entries: []cp.CacheEntry{{Key: "3", Prefix: "00000000000000ab"}}},
		{WorkerID: "b-r0", Kind: cp.KindDecode, GroupID: "b", Entries: []cp.CacheEntry{{Key: "4", Prefix: "00000000000000cd"}}}})
	if e := reps[0].Entries; e[0].Prefix != "00000000000000ab" || e[1].Prefix != "" {
		t.Errorf("prefixes filled from the group's head: %+v", e)
	}
	for _, tc := range []struct {
		args []string
		all  bool
		want string
	}{
		{nil, false, "or give --all"},
		{[]string{"w"}, false, "or give --all"},
		{[]string{"w", "k", "x"}, false, "or give --all"},
		{[]string{"w", "k"}, true, "not a key"},
		{[]string{"w.>", "k"}, false, `worker "w.>"`},
		{[]string{"w", "k*"}, false, `cache entry key "k*"`},
	} {
		if _, _, err := dropArgs(tc.args, tc.all); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("dropArgs(%q, all %v): %v, want an error naming %q", tc.args, tc.all, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args        []string
		all         bool
		worker, key string
	}{{nil, true, "", ""}, {[]string{"w"}, true, "w", ""}, {[]string{"w", "k"}, false, "w", "k"}} {
		if w, k, err := dropArgs(tc.args, tc.all); err != nil || w != tc.worker || k != tc.key {
			t.Errorf("dropArgs(%q, all %v) = %q, %q, %v", tc.args, tc.all, w, k, err)
		}
	}
}
