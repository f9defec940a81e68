package openai_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/internal/testimage"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// sdkTurn is what images.mjs prints of one turn.
type sdkTurn struct {
	Content string `json:"content"`
	Finish  string `json:"finish"`
	Usage   struct {
		Prompt  int `json:"prompt_tokens"`
		Details *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Tandem struct {
		JobID  string `json:"job_id"`
		Route  string `json:"route"`
		Timing struct {
			CachedTokens int    `json:"cached_tokens"`
			CachedOn     string `json:"cached_on"`
		} `json:"timing"`
	} `json:"tandem"`
	CachedHeader int `json:"cachedHeader"`
}

// TestOpenAISDKImages: the official openai package sends a chat about an
// image (a data: URL in an image_url part) through both paths, the prefill
// worker's (remote) and the decode group's own prefill (local): each path
// runs the checkpoint's vision tower where the prompt prefills, the greedy
// ids of both equal the monolithic model's with the same image's features
// in place of its pad rows, and the second turn about the same image
// resumes from a prefix cache (usage.prompt_tokens_details, tandem's
// timing and X-Tandem-Cached-Tokens say how many tokens).
func TestOpenAISDKImages(t *testing.T) {
	if testing.Short() {
		t.Skip("node client; -short (TestImageRefusals covers the front door's image handling)")
	}
	if _, err := os.Stat(filepath.Join(clientDir, "node_modules", "openai", "package.json")); err != nil {
		t.Skipf("npm openai not installed (run %s/setup.sh): %v", clientDir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node not found: %v", err)
	}
	storeDir := t.TempDir()
	d := startDeploymentWith(t, func(o *cluster.Options) { o.PrefixStore.Dir = storeDir }, func(c *openai.Config) {
		c.APIKeys = []string{"sk-tandem-test"}
		c.Policy = cp.PolicyRemote
	})
	if !d.c.Model.Vision {
		t.Fatal("the demo model has no vision tower")
	}
	local := d.frontDoor(t, cp.PolicyLocal)

	img := testimage.PNG(t, 280, 224, 9) // 20 x 16 patches: 80 feature rows
	sdk := func(url string) (out struct{ First, Second sdkTurn }) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "images.mjs")
		cmd.Dir = clientDir
		cmd.Env = append(os.Environ(), "TANDEM_URL="+url+"/v1", "TANDEM_MODEL="+modelName, "TANDEM_KEY=sk-tandem-test",
			"TANDEM_IMAGE=data:image/png;base64,"+base64.StdEncoding.EncodeToString(img))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("node images.mjs: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
		t.Logf("the SDK saw: %s", stdout.String())
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
			t.Fatalf("%v: %s", err, stdout.String())
		}
		return out
	}
	// Each path starts cold, so that its first turn runs its own tower:
	// the caches are dropped between them.
	out := map[string]struct{ First, Second sdkTurn }{}
	out["local"] = sdk(local)
	d.dropCaches(t)
	out["remote"] = sdk(d.url)

	// The prompts as the front door renders them.
	ci, err := images.DefaultLimits().Decode(0, img)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Rows != 80 {
		t.Fatalf("%d feature rows, want 80", ci.Rows)
	}
	part := func(text string) []byte {
		b, _ := json.Marshal([]any{map[string]any{"type": "text", "text": text},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:,"}}})
		return b
	}
	firstChat := []tokenizer.ChatMessage{tokenizer.Text("system", "You describe pictures in a few words, plainly and without guessing what is not shown."),
		{Role: "user", Content: part("What is in this picture?")}}
	render := func(msgs []tokenizer.ChatMessage) []int32 {
		ids, err := d.c.Tokenizer.EncodeChat(&tokenizer.Chat{Messages: msgs, ReasoningEffort: "none", Images: []tokenizer.ChatImage{ci}})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int32, len(ids))
		for i, id := range ids {
			out[i] = int32(id)
		}
		return out
	}
	dir := testmodel.Dir(t, "demo", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	check := func(name string, turn sdkTurn, prompt []int32, route string) []int32 {
		t.Helper()
		if turn.Usage.Prompt != len(prompt) || turn.Tandem.Route != route {
			t.Errorf("%s: %d prompt tokens routed %q, want %d routed %s", name, turn.Usage.Prompt, turn.Tandem.Route, len(prompt), route)
		}
		ids := jobOutput(t, d, turn.Tandem.JobID)
		want := testimage.Greedy(t, ref, dir, prompt, [][]byte{img}, len(ids))
		if !slices.Equal(ids, want) {
			t.Errorf("%s: greedy ids %v, the monolithic model's %v", name, ids, want)
		}
		return ids
	}
	prompt1 := render(firstChat)
	remote1 := check("remote, first turn", out["remote"].First, prompt1, "remote")
	local1 := check("local, first turn", out["local"].First, prompt1, "local")
	if !slices.Equal(remote1, local1) {
		t.Errorf("first turn: remote ids %v, local %v", remote1, local1)
	}
	for _, path := range []string{"remote", "local"} {
		first, second := out[path].First, out[path].Second
		msgs := append(slices.Clone(firstChat), tokenizer.Text("assistant", first.Content), tokenizer.Text("user", "And what colours does it have?"))
		check(path+", second turn", second, render(msgs), path)
		if c := first.Tandem.Timing.CachedTokens; c != 0 {
			t.Errorf("%s, first turn: %d tokens from a cache, want a cold prefill", path, c)
		}
		cached := second.Tandem.Timing.CachedTokens
		if cached < 64 || second.CachedHeader != cached || second.Usage.Details == nil || second.Usage.Details.Cached != cached {
			t.Errorf("%s, second turn: %d cached tokens (header %d, usage %+v), want at least 64, everywhere the same", path, cached,
				second.CachedHeader, second.Usage.Details)
		}
		t.Logf("%s: the second turn resumed %d of %d prompt tokens from %s", path, cached, second.Usage.Prompt, second.Tandem.Timing.CachedOn)
	}
}

// frontDoor starts another front door on the deployment's cluster and
// connection, whose jobs take policy; it returns its URL.
func (d *deployment) frontDoor(t *testing.T, policy cp.Policy) string {
	t.Helper()
	srv, err := openai.New(openai.Config{Conn: d.nc, Model: d.c.Model, Tokenizer: d.c.Tokenizer, ModelName: modelName,
		APIKeys: []string{"sk-tandem-test"}, Policy: policy, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeListener(ctx, ln, nil) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// dropCaches empties the prefix caches of the prefill worker and every
// decode rank.
func (d *deployment) dropCaches(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := d.c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-cache")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, w := range []string{"prefill-0", d.c.RankID(0), d.c.RankID(1)} {
		if _, err := cp.DropCache(ctx, nc, w, ""); err != nil {
			t.Fatalf("drop the caches of %s: %v", w, err)
		}
	}
}

// jobOutput is the token ids job generated, from its final event (the
// front door's client owns the job).
func jobOutput(t *testing.T, d *deployment, job string) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := cp.ListJobs(ctx, d.nc, &cp.ListJobsRequest{JobID: job})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Jobs) != 1 || rep.Jobs[0].Output == nil || rep.Jobs[0].State != cp.StateDone {
		t.Fatalf("job %s: %+v", job, rep.Jobs)
	}
	return rep.Jobs[0].Output.TokenIDs
}
