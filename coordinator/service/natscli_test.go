//go:build unix

package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// docBlocks returns the fenced blocks of docs/PROTOCOL.md that follow the
// markers <!-- nats-cli:NAME -->.
func docBlocks(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "PROTOCOL.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- nats-cli:([a-z]+) -->\n```sh\n(.*?)```")
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	for _, name := range []string{"login", "follow", "submit", "list", "cancel"} {
		if out[name] == "" {
			t.Fatalf("docs/PROTOCOL.md has no nats-cli:%s block", name)
		}
	}
	return out
}

// shell runs the documented commands: the login block, then script, in
// bash in the repository's root, with HOME holding the client's identity
// and the pinned nats CLI on PATH.
func shell(ctx context.Context, home, natsDir, login, script string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-euc", login+script)
	cmd.Dir = filepath.Join("..", "..")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") && !strings.HasPrefix(kv, "NATS_") &&
			!strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "HOME="+home, "PATH="+natsDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	// The follower runs until the test ends: its process group goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// TestWholeJobFromTheNATSCLI runs the nats CLI walk-through of
// docs/PROTOCOL.md, block by block and exactly as written (only the URL is
// this test's server), against a real nats-server with tandem's
// identities: the client follows its jobs, submits a chat as JSON without
// a header, and gets the job's events and tokens as JSON lines, then its
// final event with the output, then a conflict for cancelling it.
func TestWholeJobFromTheNATSCLI(t *testing.T) {
	natsBin := natstest.Tool(t, "nats")
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found: the walk-through is a shell session")
	}
	blocks := docBlocks(t)
	ids := cp.NewIdentities()
	opt := testOptions(t)
	opt.ModelDir = testmodel.Dir(t, "demo", 1, 2)
	opt.Identities = ids
	opt.NATSURL, _ = secureProcess(t, ids)
	c := startCluster(t, opt)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The client's identity where the login block reads it.
	home := t.TempDir()
	credDir := filepath.Join(home, ".config", "tandem", "nats")
	if err := os.MkdirAll(credDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := cp.SaveIdentity(cp.IdentityFile(credDir, cp.PrincipalClient), cp.Find(ids, cp.PrincipalClient)); err != nil {
		t.Fatal(err)
	}
	const docURL = "NATS_URL=nats://127.0.0.1:4222"
	if !strings.Contains(blocks["login"], docURL) {
		t.Fatalf("the login block does not set %s", docURL)
	}
	login := strings.Replace(blocks["login"], docURL, "NATS_URL="+opt.NATSURL, 1)
	natsDir := filepath.Dir(natsBin)

	// Terminal 1: the follower, its lines read as they come.
	follow := shell(ctx, home, natsDir, login, blocks["follow"])
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var followErr strings.Builder
	follow.Stderr = &followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = follow.Cancel(); _ = follow.Wait() }()
	lines := make(chan string, 4096)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the follower ended waiting for %s: %v\n%s", what, follow.Wait(), followErr.String())
			}
			return l
		case <-ctx.Done():
			t.Fatalf("no %s from the follower: %v\n%s", what, ctx.Err(), followErr.String())
		}
		return ""
	}

	// The follower's subscription is in place once it prints what the
	// coordinator identity publishes on the client's namespace.
	coord, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "probe")
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	probeSubject := cp.ClientJobEvents(cp.DefaultClient, "probe") // a job id no job has
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for probed := false; !probed; {
		if err := coord.Publish(probeSubject, []byte(`{"probe":true}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case l := <-lines:
			probed = l == `{"probe":true}`
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the follower never subscribed: %s", followErr.String())
		}
	}

	// Terminal 2: submit.
	wantID := cp.JobIDForKey(cp.DefaultClient, "hello-1")
	for _, b := range []string{"list", "cancel"} {
		if !strings.Contains(blocks[b], wantID) {
			t.Fatalf("the %s block does not name the job %s that the key hello-1 makes", b, wantID)
		}
	}
	out, err := shell(ctx, home, natsDir, login, blocks["submit"]).CombinedOutput()
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	var rep cp.SubmitReply
	if err := json.Unmarshal([]byte(lastLine(string(out))), &rep); err != nil || rep.JobID != wantID || rep.Error != "" {
		t.Fatalf("submit reply %q (%v), want job %s", out, err, wantID)
	}

	// The job's events and tokens, as JSON lines.
	var events []cp.JobEvent
	var tokens []cp.TokenMsg
	var final *cp.JobEvent
	lastToken := false
	for final == nil || !lastToken {
		l := next("the job's events and tokens")
		if l == `{"probe":true}` {
			continue
		}
		var probe map[string]any
		if err := json.Unmarshal([]byte(l), &probe); err != nil {
			t.Fatalf("the follower printed %q: not JSON (%v)", l, err)
		}
		switch {
		case probe["state"] != nil:
			var ev cp.JobEvent
			if err := cp.Unmarshal(cp.JSON, []byte(l), &ev); err != nil {
				t.Fatalf("event %q: %v", l, err)
			}
			events = append(events, ev)
			if ev.State.Final() {
				final = &ev
			}
		case probe["index"] != nil:
			var tm cp.TokenMsg
			if err := cp.Unmarshal(cp.JSON, []byte(l), &tm); err != nil {
				t.Fatalf("token %q: %v", l, err)
			}
			tokens = append(tokens, tm)
			lastToken = lastToken || tm.Final
		default:
			t.Fatalf("the follower printed %q: neither an event nor a token", l)
		}
	}
	if final.State != cp.StateDone || final.JobID != wantID || final.Output == nil {
		t.Fatalf("final event %+v", final)
	}
	var states []cp.JobState
	for _, ev := range events {
		if len(states) == 0 || states[len(states)-1] != ev.State {
			states = append(states, ev.State)
		}
	}
	if states[0] != cp.StateQueued || !slices.Contains(states, cp.StateRouted) || !slices.Contains(states, cp.StateDecoding) {
		t.Fatalf("states %v", states)
	}
	var text strings.Builder
	var got []int32
	for i, tm := range tokens {
		if tm.Index != i || tm.JobID != wantID {
			t.Fatalf("token %d: %+v", i, tm)
		}
		if tm.TokenID >= 0 {
			got = append(got, tm.TokenID)
		}
		text.WriteString(tm.Text)
	}
	if !slices.Equal(got, final.Output.TokenIDs) || text.String() != final.Output.Text || len(got) == 0 || len(got) > 8 {
		t.Fatalf("tokens %v %q; the final event's output %v %q", got, text.String(), final.Output.TokenIDs, final.Output.Text)
	}
	// The prompt is the chat template's framing of the turn.
	framed, err := c.Tokenizer.EncodeChat(&tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("user", "Hello")}})
	if err != nil {
		t.Fatal(err)
	}
	if final.Timing == nil || final.Timing.PromptTokens != len(framed) {
		t.Fatalf("timing %+v, want %d prompt tokens", final.Timing, len(framed))
	}

	// The final event, asked for by id.
	out, err = shell(ctx, home, natsDir, login, blocks["list"]).CombinedOutput()
	if err != nil {
		t.Fatalf("list: %v\n%s", err, out)
	}
	var list cp.ListJobsReply
	if err := json.Unmarshal([]byte(lastLine(string(out))), &list); err != nil || len(list.Jobs) != 1 {
		t.Fatalf("list reply %q: %v", out, err)
	}
	if j := list.Jobs[0]; j.JobID != wantID || j.State != cp.StateDone || j.Output == nil || j.Output.Text != final.Output.Text {
		t.Fatalf("listed %+v", j)
	}

	// Cancelling a finished job: a conflict, in JSON.
	out, err = shell(ctx, home, natsDir, login, blocks["cancel"]).CombinedOutput()
	if err != nil {
		t.Fatalf("cancel: %v\n%s", err, out)
	}
	var crep cp.CancelReply
	if err := json.Unmarshal([]byte(lastLine(string(out))), &crep); err != nil || crep.Code != cp.CodeConflict {
		t.Fatalf("cancel reply %q (%v), want code conflict", out, err)
	}
	if want := fmt.Sprintf("job %s is done already", wantID); crep.Error != want {
		t.Fatalf("cancel error %q, want %q", crep.Error, want)
	}
}
