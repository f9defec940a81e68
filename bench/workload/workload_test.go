package workload

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestTraceRoundTrip(t *testing.T) {
	jobs, err := Agent(AgentSpec{Seed: 7, Sessions: 3, Turns: 4, First: 1000, Growth: 500, Interval: 37 * time.Second,
		SessionsPerMin: 2, OutputMin: 1, OutputMax: 9})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, jobs); err != nil {
		t.Fatal(err)
	}
	back, err := ReadTrace(&buf, "rt.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(jobs, back) {
		t.Fatalf("round trip changed the jobs:\n%+v\n%+v", jobs, back)
	}
}

func TestTraceDefaultsAndComments(t *testing.T) {
	in := "# a trace\n\n{\"arrival_s\": 2, \"prompt_tokens\": 10}\n{\"id\": \"x\", \"arrival_s\": 1.5, \"prompt_tokens\": 3, \"output_tokens\": 4}\n"
	jobs, err := ReadTrace(strings.NewReader(in), "t")
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{{ID: "x", Arrival: 1500 * time.Millisecond, Prompt: 3, Output: 4}, {ID: "line3", Arrival: 2 * time.Second, Prompt: 10, Output: 1}}
	if !reflect.DeepEqual(jobs, want) {
		t.Fatalf("got %+v, want %+v (sorted by arrival, defaults filled)", jobs, want)
	}
}

func TestTraceErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"arrival_s": 1, "prompt_tokens": 5, "prompt": 3}`, `t:1: json: unknown field "prompt"`},
		{"\n{\"prompt_tokens\": 5}", "t:2: arrival_s is missing"},
		{`{"arrival_s": -1, "prompt_tokens": 5}`, "t:1: arrival_s -1"},
		{`{"arrival_s": 1, "prompt_tokens": 0}`, "t:1: job line1: prompt of 0 tokens"},
		{`{"arrival_s": 1, "prompt_tokens": 2} {}`, "t:1: more than one JSON value"},
		{"{\"id\":\"a\",\"arrival_s\":1,\"prompt_tokens\":2}\n{\"id\":\"a\",\"arrival_s\":1,\"prompt_tokens\":2}", "id a is used twice"},
		{"# nothing\n", "t: no jobs"},
		{`{"arrival_s": 1, "prompt_tokens": `, "t:1: unexpected EOF"},
	} {
		_, err := ReadTrace(strings.NewReader(c.in), "t")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
	if _, err := LoadTrace("/no/such/trace.jsonl"); err == nil || !strings.Contains(err.Error(), "/no/such/trace.jsonl") {
		t.Errorf("missing file: %v", err)
	}
}

func TestMixIsSeededAndWithinItsRanges(t *testing.T) {
	spec := MixSpec{Seed: 1, Jobs: 500, PerMin: 6, ShortMin: 100, ShortMax: 1000, LongMin: 50000, LongMax: 60000, LongFraction: 0.2, OutputMin: 5, OutputMax: 7}
	a, err := Mix(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Mix(spec)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave different jobs")
	}
	spec.Seed = 2
	if c, _ := Mix(spec); reflect.DeepEqual(a, c) {
		t.Fatal("another seed gave the same jobs")
	}
	long := 0
	for i, j := range a {
		short := j.Prompt >= 100 && j.Prompt <= 1000
		isLong := j.Prompt >= 50000 && j.Prompt <= 60000
		if !short && !isLong || j.Output < 5 || j.Output > 7 {
			t.Fatalf("job %+v outside the ranges", j)
		}
		if isLong {
			long++
		}
		if i > 0 && j.Arrival < a[i-1].Arrival {
			t.Fatal("arrivals out of order")
		}
	}
	if long < 70 || long > 130 {
		t.Fatalf("%d long prompts of 500, want about 100", long)
	}
	s := Summarize(a)
	if s.ArrivalsPerMin < 5 || s.ArrivalsPerMin > 7 || s.Jobs != 500 || s.Sessions != 0 {
		t.Fatalf("summary %+v, want about 6 arrivals a minute", s)
	}
	if _, err := Mix(MixSpec{Jobs: 1, PerMin: 1, ShortMin: 10, ShortMax: 5, OutputMin: 1, OutputMax: 1}); err == nil || !strings.Contains(err.Error(), "short prompts 10..5") {
		t.Fatalf("bad range: %v", err)
	}
}

func TestAgentSessionsGrow(t *testing.T) {
	jobs, err := Agent(K3Agent(3, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(jobs); err != nil {
		t.Fatal(err)
	}
	last := map[string]Job{}
	for _, j := range jobs {
		if p, ok := last[j.Session]; ok {
			if j.Turn != p.Turn+1 || j.Prompt < p.Prompt || j.Arrival <= p.Arrival {
				t.Fatalf("turn %+v after %+v: want the next turn, a longer prompt, later", j, p)
			}
		} else if j.Turn != 0 {
			t.Fatalf("session %s starts at turn %d", j.Session, j.Turn)
		}
		last[j.Session] = j
	}
	s := Summarize(jobs)
	if s.Sessions != 10 || s.Jobs != 100 || s.MaxPrompt < 10000 {
		t.Fatalf("summary %+v", s)
	}
	if _, err := Agent(AgentSpec{Sessions: 1, Turns: 1, First: 1, SessionsPerMin: 1, OutputMin: 1, OutputMax: 1}); err == nil || !strings.Contains(err.Error(), "interval") {
		t.Fatalf("no interval: %v", err)
	}
}
