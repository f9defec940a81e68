package draft

import (
	"slices"
	"testing"
)

func TestForcedProposesTheContinuation(t *testing.T) {
	prompt := []int32{5, 6, 7}
	cont := []int32{10, 11, 12, 13, 14, 15}
	f := &Forced{Accept: 1, Vocab: 100}
	if err := f.Add(prompt, cont); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		tokens []int32
		k      int
		want   []int32
	}{
		{[]int32{5, 6, 7}, 3, []int32{10, 11, 12}},
		{[]int32{5, 6, 7, 10, 11}, 3, []int32{12, 13, 14}},
		{[]int32{5, 6, 7, 10, 11, 12, 13, 14}, 4, []int32{15}},
		{[]int32{5, 6, 7, 10, 11, 12, 13, 14, 15}, 4, nil}, // past the record
		{[]int32{5, 6, 7, 10, 99}, 3, nil},                 // the output left the record
		{[]int32{5, 6, 8}, 3, nil},                         // another prompt
		{[]int32{5, 6}, 3, nil},
	}
	for _, c := range cases {
		if got := f.Draft(c.tokens, c.k); !slices.Equal(got, c.want) {
			t.Errorf("Draft(%v, %d) = %v, want %v", c.tokens, c.k, got, c.want)
		}
	}
}

// Each drafted token is wrong with probability 1-Accept, by position, the
// same on every call; a wrong token is never the right one.
func TestForcedPlantsErrorsAtTheRate(t *testing.T) {
	const n = 20000
	prompt := []int32{1, 2}
	cont := make([]int32, n)
	for i := range cont {
		cont[i] = int32(i % 50)
	}
	for _, accept := range []float64{0, 0.5, 0.7, 0.9} {
		f := &Forced{Accept: accept, Vocab: 50}
		if err := f.Add(prompt, cont); err != nil {
			t.Fatal(err)
		}
		d := f.Draft(prompt, n)
		again := f.Draft(prompt, n)
		right := 0
		for i := range d {
			if d[i] == cont[i] {
				right++
			} else if d[i] != (cont[i]+1)%50 {
				t.Fatalf("accept %.1f: position %d drafted %d, neither %d nor its planted error", accept, i, d[i], cont[i])
			}
		}
		if !slices.Equal(d, again) {
			t.Fatalf("accept %.1f: two calls drafted differently", accept)
		}
		// 20,000 Bernoulli draws: 4 standard deviations is under 0.015.
		if got := float64(right) / n; got < accept-0.015 || got > accept+0.015 {
			t.Errorf("accept %.1f: %.3f of the drafted tokens are right", accept, got)
		}
		// A later call from inside the continuation drafts the same tokens.
		if mid := f.Draft(append(slices.Clone(prompt), cont[:100]...), 5); !slices.Equal(mid, d[100:105]) {
			t.Errorf("accept %.1f: drafting from position 100 gave %v, from the start %v", accept, mid, d[100:105])
		}
	}
}

func TestForcedRefusesAnEmptyPrompt(t *testing.T) {
	if err := (&Forced{}).Add(nil, []int32{1}); err == nil {
		t.Fatal("an empty prompt was accepted")
	}
}

func TestParseForced(t *testing.T) {
	f, err := ParseForced([]byte("{\"prompt\":[1,2],\"output\":[3,4]}\n\n{\"prompt\":[7],\"output\":[8]}\n"), 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Draft([]int32{1, 2}, 4); !slices.Equal(got, []int32{3, 4}) {
		t.Errorf("drafted %v after the first prompt", got)
	}
	for _, bad := range []struct {
		data   string
		accept float64
	}{
		{`{"prompt":[1,2],"output":[30]}`, 1},
		{`{"prompt":[],"output":[3]}`, 1},
		{`{"prompt":[1],`, 1},
		{`{"prompt":[1],"output":[2]}`, 1.5},
	} {
		if _, err := ParseForced([]byte(bad.data), bad.accept, 10); err == nil {
			t.Errorf("ParseForced(%q, %v) accepted it", bad.data, bad.accept)
		} else {
			t.Log(err)
		}
	}
}
