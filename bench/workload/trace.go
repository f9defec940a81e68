package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// A trace file is JSON Lines: one job per line,
//
//	{"id": "j1", "arrival_s": 0.5, "prompt_tokens": 1200, "output_tokens": 32, "session": "s1", "turn": 0}
//
// with arrival_s the seconds since the trace's start. id defaults to the
// line number, output_tokens to 1, session and turn to none. Blank lines and
// lines starting with # are skipped; an unknown field is an error, so that a
// misspelt key is not silently ignored.

// record is a trace line.
type record struct {
	ID       string   `json:"id,omitempty"`
	ArrivalS *float64 `json:"arrival_s"`
	Prompt   int      `json:"prompt_tokens"`
	Output   int      `json:"output_tokens,omitempty"`
	Session  string   `json:"session,omitempty"`
	Turn     int      `json:"turn,omitempty"`
}

// maxLine bounds one trace line (a job is a few dozen bytes).
const maxLine = 64 << 10

// ReadTrace parses a trace and returns its jobs in arrival order. name is
// used in errors.
func ReadTrace(r io.Reader, name string) ([]Job, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	var jobs []Job
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		var rec record
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%s:%d: more than one JSON value on the line", name, n)
		}
		if rec.ArrivalS == nil {
			return nil, fmt.Errorf("%s:%d: arrival_s is missing", name, n)
		}
		a := *rec.ArrivalS
		if math.IsNaN(a) || a < 0 || a > 1e9 {
			return nil, fmt.Errorf("%s:%d: arrival_s %v is not a time in seconds from the trace start", name, n, a)
		}
		j := Job{ID: rec.ID, Arrival: time.Duration(math.Round(a * float64(time.Second))), Prompt: rec.Prompt, Output: rec.Output, Session: rec.Session, Turn: rec.Turn}
		if j.ID == "" {
			j.ID = fmt.Sprintf("line%d", n)
		}
		if j.Output == 0 {
			j.Output = 1
		}
		if err := j.Validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		jobs = append(jobs, j)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("%s: no jobs", name)
	}
	if err := Validate(jobs); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	Sort(jobs)
	return jobs, nil
}

// LoadTrace reads a trace file.
func LoadTrace(path string) ([]Job, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	return ReadTrace(f, path)
}

// WriteTrace writes jobs as a trace that ReadTrace reads back unchanged
// (arrivals to the nanosecond).
func WriteTrace(w io.Writer, jobs []Job) error {
	bw := bufio.NewWriter(w)
	for _, j := range jobs {
		a := j.Arrival.Seconds()
		rec := record{ID: j.ID, ArrivalS: &a, Prompt: j.Prompt, Output: j.Output, Session: j.Session, Turn: j.Turn}
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}
