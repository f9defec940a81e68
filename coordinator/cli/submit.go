package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
)

func submitCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "submit [PROMPT]",
		Short: "run a job: stream its tokens, then print how it was routed and where its time went",
		Long: `Submit a job and follow it to its end. The prompt is the argument (text), a
file (--file, "-" for stdin) or token ids (--ids 5,17,200), or a chat:
--chat FILE.json takes an OpenAI chat completions request body (messages,
tools, tool_choice, response_format, reasoning_effort, max_tokens,
temperature, ...; "-" for stdin), --user the text as one user message. Text
is tokenized, and a chat rendered in Kimi K3's conversation format, by the
coordinator.

Images: --image FILE (PNG, JPEG, GIF or WebP; repeatable) sends images with
the prompt. With text (an argument or --file) the prompt becomes one user
message holding the images first, in the order given, then the text (as
--user, with --system if given). With --chat the images go first in the
chat's last user message, and the chat's own image_url parts are read too
when they are data: URLs (data:image/png;base64,...; submit fetches no
http(s) URLs). With --ids the ids must already hold each image's marker,
its <|media_pad|> id repeated once per feature row; the coordinator checks
the count. The model must have a vision tower; the coordinator refuses
images over its limits (images.* settings).

The generated text goes to stdout as it streams (token ids
when the model has no tokenizer); a chat's thinking and response are
printed apart, under "thinking:" and "response:", and its tool calls after
them; the route and the timing go to stderr.
On a terminal, stderr shows the job's progress as it goes (queued, waiting
for a weight pass, layers prefilled n/N, transfer, the first token);
piped or redirected, it stays quiet until the report at the end. --json
prints the job's events and tokens instead, one JSON object a line, as a
JSON submitter gets them on NATS (JobEvent and TokenMsg of
docs/PROTOCOL.md: an event has "state", a token "index").

The client picks an idempotency key (or takes --key), so it knows the job id
before submitting and a retried submit runs the job once.

` + settingsHelp(natsSettings),
		Args: cobra.MaximumNArgs(1),
		RunE: runSubmit,
	}
	f := cmd.Flags()
	f.String("file", "", "read the prompt text from this file (- for stdin)")
	f.String("ids", "", "the prompt as comma-separated token ids")
	f.String("chat", "", "an OpenAI chat completions request body (`file.json`, - for stdin): its messages, tools and parameters; flags given override its sampling")
	f.Bool("user", false, "send the text as a user message in K3's conversation format")
	f.String("system", "", "with --user or --image: a system message first")
	f.StringArray("image", nil, "send this image `file` with the prompt (repeatable; see Images above)")
	f.Int("max-tokens", 0, "tokens to generate (0: the coordinator's default)")
	f.Float64("temperature", 0, "sampling temperature (0: greedy)")
	f.Float64("top-p", 0, "nucleus sampling threshold (0 or 1: off)")
	f.Int("top-k", 0, "keep the k most likely tokens (0: off)")
	f.Uint64("seed", 0, "sampler seed")
	f.StringArray("stop", nil, "stop text (repeatable)")
	f.Int32Slice("stop-id", nil, "stop token ids")
	f.String("policy", "", "routing: auto, local or remote (default: the coordinator's)")
	f.String("key", "", "idempotency key (default: a random one)")
	f.Duration("timeout", 0, "give up waiting after this long (0: never; the job keeps running); until then the client rides out any outage of NATS or the coordinator")
	f.Bool("json", false, "print the job's events and tokens as JSON lines on stdout instead of the text")
	addFlags(f, natsSettings)
	return cmd
}

// submitConnName names the submit command's connection, which reconnects
// forever.
const submitConnName = "tandem-submit"

func runSubmit(cmd *cobra.Command, args []string) error {
	v, err := resolve(cmd, natsSettings)
	if err != nil {
		return err
	}
	f := cmd.Flags()
	req, err := submission(cmd, args)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if d, _ := f.GetDuration("timeout"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	nc, err := connectCtx(ctx, v, submitConnName, cp.PrincipalClient)
	if err != nil {
		return err
	}
	defer nc.Close()
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	asJSON, _ := f.GetBool("json")
	var jsonErr error
	printJSON := func(v any) {
		// Events and tokens as the protocol's JSON objects, one a line: what
		// a JSON submitter reads on NATS (docs/PROTOCOL.md).
		b, err := json.Marshal(v)
		if err == nil {
			_, err = fmt.Fprintln(out, string(b))
		}
		if err != nil && jsonErr == nil {
			jsonErr = err
		}
	}
	// Progress only on a terminal: piped or redirected, stderr stays
	// quiet until the report at the end.
	var prog *progressLine
	if !asJSON && isTerminal(errw) {
		prog = newProgressLine(errw, time.Now())
		defer prog.Close()
	}
	ch := &chatPrinter{w: out}
	h := client.Handlers{
		Event: func(ev cp.JobEvent) {
			switch {
			case asJSON:
				printJSON(ev)
			case prog != nil:
				prog.event(ev)
			}
		},
		Token: func(t cp.TokenMsg) {
			if prog != nil {
				prog.token()
			}
			switch {
			case asJSON:
				printJSON(t)
			case len(req.Messages) > 0:
				ch.token(t)
			case t.Text != "":
				fmt.Fprint(out, client.Printable(t.Text))
			case t.TokenID >= 0 && req.Prompt == "" && len(req.Messages) == 0:
				fmt.Fprintf(out, "%d ", t.TokenID)
			}
		},
	}
	h.Gap = func(from, to int) {
		if asJSON {
			return // the JSON reader sees the indices skip
		}
		// The stream goes on after the gap; the whole output follows
		// at the end.
		fmt.Fprintf(errw, "\n(the connection dropped: %d tokens missed; the stream goes on, the whole output follows at the end)\n", to-from)
	}
	res, err := client.Run(ctx, nc, req, h)
	if err != nil {
		if res != nil && res.JobID != "" {
			return fmt.Errorf("%w (the job goes on: coordinator jobs / coordinator cancel %s)", err, res.JobID)
		}
		return err
	}
	if res.Recovered && !asJSON {
		// The stream above lacks what was published while the
		// connection was down: print the whole text once more.
		fmt.Fprintf(errw, "\n(the connection dropped while the job ran; its whole output follows)\n")
		if len(req.Messages) > 0 {
			ch.section = ""
			ch.whole(res)
		} else if res.Text != "" {
			fmt.Fprint(out, client.Printable(res.Text))
		} else {
			for _, t := range res.Tokens {
				fmt.Fprintf(out, "%d ", t)
			}
		}
	}
	if prog != nil {
		prog.Close()
	}
	if !asJSON {
		ch.calls(res.Calls)
		fmt.Fprintln(out)
		if prog == nil && res.Final.Route != nil {
			// Not shown as it happened: the route leads the report.
			fmt.Fprintf(errw, "routed %s\n  %s\n", client.Route(res.Final.Route), res.Final.Route.Reason)
		}
		fmt.Fprintf(errw, "job %s %s", res.JobID, res.Final.State)
		if finish := res.Finish; finish != "" {
			if finish == cp.FinishStop && len(res.Calls) > 0 {
				finish = "tool_calls" // as the OpenAI API says it
			}
			fmt.Fprintf(errw, " (%s)", finish)
		}
		fmt.Fprintln(errw)
		if res.Final.Error != nil {
			fmt.Fprintf(errw, "  %v\n", res.Final.Error)
		}
		if res.Final.Route != nil {
			fmt.Fprint(errw, client.Timing(res.Final.Timing, res.Final.Route.Target))
		}
	}
	if jsonErr != nil {
		return fmt.Errorf("--json: writing the job's events and tokens: %w", jsonErr)
	}
	return res.Err()
}

// submission builds the request from the arguments and flags.
func submission(cmd *cobra.Command, args []string) (cp.SubmitRequest, error) {
	f := cmd.Flags()
	var req cp.SubmitRequest
	file, _ := f.GetString("file")
	ids, _ := f.GetString("ids")
	sources := 0
	for _, given := range []bool{len(args) > 0, file != "", ids != ""} {
		if given {
			sources++
		}
	}
	chatFile, _ := f.GetString("chat")
	if chatFile != "" {
		sources++
	}
	if sources != 1 {
		return req, errors.New("give the prompt once: as an argument, --file, --ids or --chat")
	}
	text := ""
	switch {
	case chatFile != "":
		var err error
		if req, err = readChatFile(chatFile, cmd.InOrStdin()); err != nil {
			return req, err
		}
	case len(args) > 0:
		text = args[0]
	case file != "":
		var b []byte
		var err error
		if file == "-" {
			b, err = io.ReadAll(cmd.InOrStdin())
		} else {
			b, err = os.ReadFile(file)
		}
		if err != nil {
			return req, fmt.Errorf("--file: %w", err)
		}
		text = string(b)
	default:
		for i, s := range strings.Split(ids, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
			if err != nil || n < 0 {
				return req, fmt.Errorf("--ids: item %d %q is not a token id", i, s)
			}
			req.TokenIDs = append(req.TokenIDs, int32(n))
		}
	}
	user, _ := f.GetBool("user")
	imageFiles, _ := f.GetStringArray("image")
	switch {
	case user && text == "":
		return req, errors.New("--user needs text (an argument or --file)")
	case user || len(imageFiles) > 0 && chatFile == "" && ids == "":
		if sys, _ := f.GetString("system"); sys != "" {
			req.Messages = append(req.Messages, cp.ChatMessage{Role: "system", Content: sys})
		}
		req.Messages = append(req.Messages, cp.ChatMessage{Role: "user", Content: text})
	case chatFile == "":
		req.Prompt = text
	}
	if len(imageFiles) > 0 {
		imgs, err := readImageFiles(imageFiles)
		if err != nil {
			return req, err
		}
		if err := addImages(&req, imgs); err != nil {
			return req, err
		}
	}
	if chatFile == "" || f.Changed("max-tokens") {
		req.MaxTokens, _ = f.GetInt("max-tokens")
	}
	if chatFile == "" || f.Changed("temperature") {
		req.Temperature, _ = f.GetFloat64("temperature")
	}
	if chatFile == "" || f.Changed("top-p") {
		req.TopP, _ = f.GetFloat64("top-p")
	}
	if chatFile == "" || f.Changed("seed") {
		req.Seed, _ = f.GetUint64("seed")
	}
	if chatFile == "" || f.Changed("stop") {
		req.Stop.Texts, _ = f.GetStringArray("stop")
	}
	req.TopK, _ = f.GetInt("top-k")
	req.Stop.TokenIDs, _ = f.GetInt32Slice("stop-id")
	policy, _ := f.GetString("policy")
	req.Policy = cp.Policy(policy)
	req.IdempotencyKey, _ = f.GetString("key")
	if err := req.Validate(); err != nil {
		return req, err
	}
	return req, nil
}

// readImageFiles reads --image files, each at most a submission's size.
func readImageFiles(files []string) ([][]byte, error) {
	var out [][]byte
	for _, name := range files {
		fh, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--image: %w", err)
		}
		b, err := io.ReadAll(io.LimitReader(fh, cp.MaxMessageSize+1))
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("--image %s: %w", name, err)
		}
		if len(b) > cp.MaxMessageSize {
			return nil, fmt.Errorf("--image %s: larger than %d bytes, more than a submission carries", name, cp.MaxMessageSize)
		}
		out = append(out, b)
	}
	return out, nil
}

// addImages puts images into req: first in its last user message (with
// token ids, after the ids' own images: the ids hold their pad runs).
func addImages(req *cp.SubmitRequest, imgs [][]byte) error {
	if len(req.Messages) == 0 {
		req.Images = append(req.Images, imgs...)
		return nil
	}
	last, before := -1, 0
	for i, m := range req.Messages {
		if m.Role == "user" {
			last = i
		}
	}
	if last < 0 {
		return errors.New("--image: the chat has no user message to hold the images")
	}
	for _, m := range req.Messages[:last] {
		for _, p := range m.Parts {
			if p.Type == cp.PartImage {
				before++
			}
		}
	}
	m := &req.Messages[last]
	parts := make([]cp.ContentPart, 0, len(imgs)+len(m.Parts)+1)
	for range imgs {
		parts = append(parts, cp.ContentPart{Type: cp.PartImage})
	}
	if m.Content != "" {
		parts = append(parts, cp.ContentPart{Type: cp.PartText, Text: m.Content})
	}
	m.Parts, m.Content = append(parts, m.Parts...), ""
	req.Images = append(req.Images[:before:before], append(imgs, req.Images[before:]...)...)
	return nil
}
