package sampling

import (
	"math"
	"math/rand/v2"
	"testing"
)

// toyModel returns logits for a position given the token before it: a
// stand-in for a model whose rows depend on the sequence so far.
func toyModel(vocab int, pos int, prev int32) []float32 {
	rng := rand.New(rand.NewPCG(uint64(pos), uint64(prev)+1))
	return randomLogits(rng, vocab)
}

// toyMask allows a position-dependent half of the vocabulary (always id 0).
func toyMask(vocab, pos int) []uint64 {
	m := make([]uint64, (vocab+63)/64)
	for id := range vocab {
		if id == 0 || (id+pos)%2 == 0 {
			m[id/64] |= 1 << (id % 64)
		}
	}
	return m
}

// TestVerifyMatchesPlainDecoding runs the toy model with and without drafts
// (some right, some wrong, k from 0 to 5) and checks the tokens are the
// same: greedy, sampled, masked or not.
func TestVerifyMatchesPlainDecoding(t *testing.T) {
	const vocab, n = 50, 300
	for _, masked := range []bool{false, true} {
		for _, p := range []Params{
			{},
			{Temperature: 1, Seed: 1},
			{Temperature: 0.6, TopK: 5, Seed: 2},
			{Temperature: 1.4, TopP: 0.8, Seed: 3},
		} {
			maskAt := func(pos int) []uint64 {
				if !masked {
					return nil
				}
				return toyMask(vocab, pos)
			}
			plain, _ := New(p)
			want := []int32{7} // the prompt's last token
			for pos := 1; pos <= n; pos++ {
				row := toyModel(vocab, pos, want[pos-1])
				var y int32
				var err error
				if m := maskAt(pos); m != nil {
					y, err = plain.SampleMasked(row, m)
				} else {
					y, err = plain.Sample(row)
				}
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, y)
			}

			spec, _ := New(p)
			guess := rand.New(rand.NewPCG(99, uint64(p.Seed)))
			got := []int32{7}
			accepts, drafted := 0, 0
			for len(got) <= n {
				pos := len(got)
				k := min(guess.IntN(6), n-pos)
				draft := make([]int32, k)
				for i := range draft {
					if pos+i <= n && guess.IntN(4) != 0 {
						draft[i] = want[pos+i] // an oracle guess
					} else {
						draft[i] = int32(guess.IntN(vocab))
					}
				}
				rows := make([][]float32, k+1)
				for i := range rows {
					prev := got[pos-1]
					if i > 0 {
						prev = draft[i-1]
					}
					rows[i] = toyModel(vocab, pos+i, prev)
				}
				acc, next, err := spec.Verify(rows, draft, func(i int) []uint64 { return maskAt(pos + i) })
				if err != nil {
					t.Fatal(err)
				}
				accepts += acc
				drafted += k
				got = append(append(got, draft[:acc]...), next)
			}
			got = got[:n+1]
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("masked %v %+v: token %d: with drafts %d, without %d", masked, p, i, got[i], want[i])
				}
			}
			if accepts == 0 || accepts == drafted {
				t.Errorf("masked %v %+v: %d of %d drafted accepted; the test exercises nothing", masked, p, accepts, drafted)
			}
		}
	}
}

// probs is the reference distribution: softmax at temperature T over the
// topK largest logits (all when 0), written apart from the sampler.
func probs(logits []float32, T float64, topK int) []float64 {
	p := make([]float64, len(logits))
	total := 0.0
	for i, l := range logits {
		rank := 0
		for j, m := range logits {
			if m > l || m == l && j < i {
				rank++
			}
		}
		if topK == 0 || rank < topK {
			p[i] = math.Exp(float64(l) / T)
			total += p[i]
		}
	}
	for i := range p {
		p[i] /= total
	}
	return p
}

// chiSquare returns Pearson's statistic and its degrees of freedom; a count
// where p is 0 makes it infinite.
func chiSquare(counts []int, p []float64) (float64, int) {
	n := 0
	for _, c := range counts {
		n += c
	}
	x2, df := 0.0, -1
	for i, c := range counts {
		if p[i] == 0 {
			if c > 0 {
				return math.Inf(1), df
			}
			continue
		}
		e := p[i] * float64(n)
		x2 += (float64(c) - e) * (float64(c) - e) / e
		df++
	}
	return x2, df
}

// chi2Crit holds the chi-square quantiles at 1-1e-4 for 1 to 4 degrees
// of freedom: a correct sampler fails one check in 10,000.
var chi2Crit = [...]float64{0, 15.14, 18.42, 21.11, 23.51}

type verifyFunc func(seed uint64, rows [][]float32, draft []int32) (int, int32)

// exactness draws the first two emitted tokens n times and returns the
// chi-square statistics of the first against p0 and of the second, given
// the first was draft[0], against p1, with their critical values.
func exactness(t *testing.T, verify verifyFunc, rows [][]float32, draft []int32, p0, p1 []float64, n int) (x0, c0, x1, c1 float64) {
	c1st := make([]int, len(p0))
	c2nd := make([]int, len(p1))
	for seed := range uint64(n) {
		acc, next := verify(seed, rows, draft)
		first := next
		if acc >= 1 {
			first = draft[0]
			second := next
			if acc >= 2 {
				second = draft[1]
			}
			c2nd[second]++
		}
		c1st[first]++
	}
	x0, df0 := chiSquare(c1st, p0)
	x1, df1 := chiSquare(c2nd, p1)
	return x0, chi2Crit[df0], x1, chi2Crit[df1]
}

// textbook is the speculative rule as usually written, apart from Verify:
// accept x with probability p(x), else draw from p with x removed. The
// planted variants are its classic bugs.
func textbook(p [][]float64, plant string) verifyFunc {
	return func(seed uint64, _ [][]float32, draft []int32) (int, int32) {
		rng := rand.New(rand.NewPCG(seed, 1))
		draw := func(q []float64, skip int32) int32 {
			total := 0.0
			for i, w := range q {
				if int32(i) != skip {
					total += w
				}
			}
			u, acc := rng.Float64()*total, 0.0
			for i, w := range q {
				if int32(i) != skip {
					acc += w
					if u < acc {
						return int32(i)
					}
				}
			}
			return int32(len(q) - 1)
		}
		for i, x := range draft {
			if plant == "accept always" || rng.Float64() < p[i][x] {
				continue
			}
			if plant == "resample with x" {
				return i, draw(p[i], -1)
			}
			return i, draw(p[i], x)
		}
		return len(draft), draw(p[len(draft)], -1)
	}
}

func TestVerifyExactDistribution(t *testing.T) {
	const n = 200_000
	row0 := []float32{1.2, 0.3, -0.5, 2.0, 0.9}
	row1 := []float32{0.1, 1.5, 1.4, -1, 0.6}
	rows := [][]float32{row0, row1, row0}
	draft := []int32{4, 1} // p about 0.17 and 0.35 at T=1
	for _, p := range []Params{{Temperature: 1}, {Temperature: 0.7, TopK: 3}} {
		ps := [][]float64{probs(row0, p.Temperature, p.TopK), probs(row1, p.Temperature, p.TopK), probs(row0, p.Temperature, p.TopK)}
		ours := func(seed uint64, rows [][]float32, draft []int32) (int, int32) {
			q := p
			q.Seed = seed
			s, _ := New(q)
			acc, next, err := s.Verify(rows, draft, nil)
			if err != nil {
				t.Fatal(err)
			}
			return acc, next
		}
		for _, v := range []struct {
			name    string
			f       verifyFunc
			planted bool
		}{
			{"Verify", ours, false},
			{"textbook", textbook(ps, ""), false},
			{"planted: accept always", textbook(ps, "accept always"), true},
			{"planted: resample with x", textbook(ps, "resample with x"), true},
		} {
			x0, c0, x1, c1 := exactness(t, v.f, rows, draft, ps[0], ps[1], n)
			pass := x0 < c0 && x1 < c1
			t.Logf("%+v %s: chi2 first %.2f (crit %.2f), second given first accepted %.2f (crit %.2f)", p, v.name, x0, c0, x1, c1)
			if pass == v.planted {
				t.Errorf("%+v %s: chi2 first %.2f (crit %.2f), second %.2f (crit %.2f); planted bug %v", p, v.name, x0, c0, x1, c1, v.planted)
			}
		}
	}
}

func TestVerifyReproducible(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rows := make([][]float32, 5)
	for i := range rows {
		rows[i] = randomLogits(rng, 8)
	}
	draft := []int32{1, 2, 3, 4}
	run := func(seed uint64) []int32 {
		s, _ := New(Params{Temperature: 3, Seed: seed})
		var out []int32
		for range 200 {
			acc, next, err := s.Verify(rows, draft, nil)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, int32(acc), next)
		}
		return out
	}
	a, b, c := run(11), run(11), run(12)
	same := true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 11 twice: result %d is %d then %d", i, a[i], b[i])
		}
		same = same && a[i] == c[i]
	}
	if same {
		t.Error("seeds 11 and 12 gave the same 200 results")
	}
}

func TestVerifyMasks(t *testing.T) {
	logits := []float32{0, 4, 1, 2}
	rows := [][]float32{logits, logits}
	notArgmax := func(int) []uint64 { return maskOf(4, 0, 2, 3) } // forbids 1, the argmax
	g, _ := New(Params{})
	if acc, next, err := g.Verify(rows, []int32{1}, notArgmax); err != nil || acc != 0 || next != 3 {
		t.Errorf("greedy, masked argmax drafted: accepted %d, next %d, %v; want 0, 3", acc, next, err)
	}
	if acc, next, err := g.Verify(rows, []int32{1}, nil); err != nil || acc != 1 || next != 1 {
		t.Errorf("greedy, no mask: accepted %d, next %d, %v; want 1, 1", acc, next, err)
	}
	s, _ := New(Params{Temperature: 2, Seed: 3})
	for range 2000 {
		acc, next, err := s.Verify(rows, []int32{1}, notArgmax)
		if err != nil || acc != 0 || next == 1 {
			t.Fatalf("sampled, masked id drafted: accepted %d, next %d, %v", acc, next, err)
		}
	}
	// The bonus row has its own mask.
	second := func(i int) []uint64 {
		if i == 1 {
			return maskOf(4, 2)
		}
		return nil
	}
	if acc, next, err := g.Verify(rows, []int32{1}, second); err != nil || acc != 1 || next != 2 {
		t.Errorf("greedy, masked bonus row: accepted %d, next %d, %v; want 1, 2", acc, next, err)
	}
}

func TestVerifyErrors(t *testing.T) {
	s, _ := New(Params{Temperature: 1})
	row := []float32{1, 2}
	if _, _, err := s.Verify([][]float32{row}, []int32{1}, nil); err == nil {
		t.Error("one row for a draft of one: no error")
	}
	bad := []float32{1, float32(math.NaN())}
	acc, _, err := s.Verify([][]float32{{0, 9}, bad}, []int32{1}, nil)
	if err == nil || acc != 1 {
		t.Errorf("NaN in row 1: accepted %d, %v; want 1 and an error", acc, err)
	}
	if acc, next, err := s.Verify([][]float32{{0, 9}}, nil, nil); err != nil || acc != 0 || next != 1 {
		t.Errorf("empty draft: %d, %d, %v; want a plain sample", acc, next, err)
	}
	if _, _, err := s.Verify([][]float32{row}, nil, func(int) []uint64 { return maskOf(2) }); err == nil {
		t.Error("a mask that allows nothing: no error")
	}
}
