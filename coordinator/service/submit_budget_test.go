package service_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
)

// bigJSONPrompt is a submission of size bytes: a million token ids in
// JSON, padded with whitespace (legal JSON) to size.
func bigJSONPrompt(size int) []byte {
	var ids bytes.Buffer
	for i := range 1_000_000 {
		if i > 0 {
			ids.WriteByte(',')
		}
		fmt.Fprint(&ids, i%200)
	}
	head, tail := `{"token_ids":[`, `],"max_tokens":1}`
	pad := max(size-len(head)-ids.Len()-len(tail), 0)
	return []byte(head + strings.Repeat(" ", pad) + ids.String() + tail)
}

// TestLargePromptsLeaveOtherClientsAnswered: 40 clients submit 7 MiB
// prompts at once (each refused after it is read: the coordinator allows
// 4096 prompt tokens) while 20 small clients submit ordinary jobs. Every
// request is answered: the small ones accepted, the large ones refused with
// too_large or unavailable. None is dropped, and no client sees "no
// responders" (the coordinator never leaves NATS).
func TestLargePromptsLeaveOtherClientsAnswered(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 280 MiB of prompts")
	}
	opt := testOptions(t)
	opt.Coordinator.MaxPromptTokens = 4096
	c := startCluster(t, opt)
	// Every request is awaited until answered; the bound is the test
	// binary's deadline, not a guess at how long 280 MiB takes on a loaded
	// machine (the small clients' fixed 30 s ran out at load 35).
	ctx := testctx.Context(t)
	big := bigJSONPrompt(7 << 20)
	if len(big) != 7<<20 {
		t.Fatalf("prompt of %d bytes", len(big))
	}
	var clients []*nats.Conn
	for range 4 {
		clients = append(clients, connect(t, c))
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	bigCodes := map[string]int{}
	var problems []string
	start := make(chan struct{})
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			nc := clients[i%len(clients)]
			m := nats.NewMsg(cp.ClientSubmit(cp.ClientName(nc)))
			m.Header.Set(cp.HeaderContentType, cp.ContentTypeJSON)
			m.Data = big
			r, err := nc.RequestMsgWithContext(ctx, m)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				problems = append(problems, fmt.Sprintf("large prompt %d: %v", i, err))
				return
			}
			var rep cp.SubmitReply
			if _, err := cp.DecodeMsg(r, &rep); err != nil {
				problems = append(problems, fmt.Sprintf("large prompt %d: reply %v", i, err))
				return
			}
			bigCodes[string(rep.Code)]++
		}()
	}
	small := make([]error, 20)
	for i := range small {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, small[i] = cp.Submit(ctx, clients[i%len(clients)], &cp.SubmitRequest{TokenIDs: testkit.Prompt(5, c.Model.VocabSize, 900+i),
				Sampling: cp.Sampling{MaxTokens: 1}})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range small {
		if err != nil {
			t.Errorf("small client %d: %v", i, err)
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("large prompts answered: %v", bigCodes)
	for code, n := range bigCodes {
		if code != string(cp.CodeTooLarge) && code != string(cp.CodeUnavailable) {
			t.Errorf("%d large prompts answered %q", n, code)
		}
	}
}
