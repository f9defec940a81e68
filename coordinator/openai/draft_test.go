package openai_test

import (
	"net/http"
	"strconv"
	"testing"
)

// TestDraftSwitch: a request's "draft": false turns speculative decoding
// off (one decode step per token, nothing drafted) and changes no token;
// the tandem field and the X-Tandem-Decode-Steps and
// X-Tandem-Accepted-Per-Step headers report the steps and the drafts.
func TestDraftSwitch(t *testing.T) {
	d := startDeployment(t, nil)
	type figures struct {
		text              string
		tokens, steps     int
		drafted, accepted int
		perStep, hdrSteps string
	}
	run := func(draft *bool) figures {
		body := chatBody("Repeat after me: one two three, one two three, one two three, one two three.", false, 24)
		if draft != nil {
			body["draft"] = *draft
		}
		resp := post(t, d.url+"/v1/chat/completions", "", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		f := figures{hdrSteps: resp.Header.Get("X-Tandem-Decode-Steps"), perStep: resp.Header.Get("X-Tandem-Accepted-Per-Step")}
		c := decode[struct {
			Choices []struct {
				Message struct {
					Content *string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Tandem struct {
				Timing *struct {
					DecodeSteps    int     `json:"decode_steps"`
					Drafted        int     `json:"drafted_tokens"`
					Accepted       int     `json:"accepted_tokens"`
					AcceptedPerStp float64 `json:"accepted_per_step"`
				} `json:"timing"`
			} `json:"tandem"`
		}](t, resp)
		if len(c.Choices) != 1 || c.Choices[0].Message.Content == nil || c.Tandem.Timing == nil {
			t.Fatalf("response %+v", c)
		}
		tm := c.Tandem.Timing
		f.text, f.tokens, f.steps, f.drafted, f.accepted = *c.Choices[0].Message.Content, c.Usage.CompletionTokens, tm.DecodeSteps, tm.Drafted, tm.Accepted
		if f.hdrSteps != strconv.Itoa(f.steps) || f.perStep == "" {
			t.Fatalf("headers: decode steps %q, accepted per step %q; body %+v", f.hdrSteps, f.perStep, *tm)
		}
		if f.steps+f.accepted != f.tokens || f.accepted > f.drafted {
			t.Fatalf("%d tokens in %d steps with %d of %d drafts accepted", f.tokens, f.steps, f.accepted, f.drafted)
		}
		return f
	}
	off := false
	without, with := run(&off), run(nil)
	if without.drafted != 0 || without.steps != without.tokens {
		t.Fatalf("draft false: %+v", without)
	}
	if with.text != without.text {
		t.Fatalf("drafting changed the reply: %q, without %q", with.text, without.text)
	}
	t.Logf("with drafts: %d tokens in %d steps, %d of %d drafts accepted (header %s per step)", with.tokens, with.steps, with.accepted, with.drafted, with.perStep)
}
