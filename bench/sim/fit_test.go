package sim

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// samplesAt times every layer of the small preset at the given lengths with
// known rates and overhead, with multiplicative noise of up to ±noise.
func samplesAt(t *testing.T, rates Compute, overhead float64, noise float64, lengths ...int) ([]LayerSample, *Model) {
	t.Helper()
	m, err := LoadModel("small")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var out []LayerSample
	for _, n := range lengths {
		for L := range m.Layers {
			s := LayerFLOPs(m.Cfg, L, 0, n).Time(rates).Seconds() + overhead
			s *= 1 + noise*(2*r.Float64()-1)
			out = append(out, LayerSample{Layer: L, Lo: 0, Hi: n, Seconds: s})
		}
	}
	return out, m
}

func TestFitComputeRecoversKnownRates(t *testing.T) {
	// Equal linear rates are recovered exactly (the preference for equal
	// rates costs nothing at the truth), and so is the attention's.
	want := Compute{KDA: 3, MLA: 3, MLAAttention: 0.7, MoE: 3, Dense: 3}
	samples, m := samplesAt(t, want, 0.002, 0, 128, 512, 2048)
	fit, err := FitCompute(m.Cfg, samples)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want float64 }{{fit.Rates.KDA, 3}, {fit.Rates.MLA, 3}, {fit.Rates.MLAAttention, 0.7}, {fit.Rates.MoE, 3}, {fit.Rates.Dense, 3}, {fit.OverheadMS, 2}} {
		if math.Abs(c.got/c.want-1) > 1e-6 {
			t.Fatalf("fit %+v, want %+v and 2 ms", fit, want)
		}
	}
	if fit.WorstResidual > 1e-6 {
		t.Fatalf("exact samples left a residual of %v", fit.WorstResidual)
	}
	// Unequal linear rates: the attention/feed-forward split is not
	// identifiable from layer times, but every layer time is predicted, and
	// the MLA attention (told apart by its growth) is found.
	want = Compute{KDA: 3.1, MLA: 1.7, MLAAttention: 0.9, MoE: 2.4, Dense: 5.5}
	samples, _ = samplesAt(t, want, 0.002, 0, 128, 512, 2048)
	if fit, err = FitCompute(m.Cfg, samples); err != nil {
		t.Fatal(err)
	}
	if fit.WorstResidual > 0.01 || math.Abs(fit.Rates.MLAAttention/0.9-1) > 0.05 {
		t.Fatalf("fit %+v: residual %v", fit.Rates, fit.WorstResidual)
	}
	// With ±3% noise the residual says how close the fit is.
	noisy, _ := samplesAt(t, want, 0.002, 0.03, 128, 512, 2048)
	if fit, err = FitCompute(m.Cfg, noisy); err != nil {
		t.Fatal(err)
	}
	if fit.WorstResidual > 0.08 || fit.WorstResidual < 0.005 || math.Abs(fit.Rates.MLAAttention/0.9-1) > 0.2 {
		t.Fatalf("noisy fit %+v, residual %v", fit.Rates, fit.WorstResidual)
	}
}

func TestFitComputeNeedsEveryTypeAndNoOverheadIsZero(t *testing.T) {
	samples, m := samplesAt(t, Compute{KDA: 1, MLA: 1, MoE: 1, Dense: 1}, 0, 0, 256, 1024)
	fit, err := FitCompute(m.Cfg, samples)
	if err != nil || fit.OverheadMS > 1e-6 {
		t.Fatalf("no overhead: fit %+v, %v", fit, err)
	}
	var noDense []LayerSample
	for _, s := range samples {
		if s.Layer != 0 {
			noDense = append(noDense, s)
		}
	}
	if _, err := FitCompute(m.Cfg, noDense); err == nil || !strings.Contains(err.Error(), "no sample has dense work") {
		t.Fatalf("without layer 0: %v", err)
	}
	bad := append([]LayerSample{{Layer: 99, Lo: 0, Hi: 3, Seconds: 1}}, samples...)
	if _, err := FitCompute(m.Cfg, bad); err == nil || !strings.Contains(err.Error(), "sample 0") {
		t.Fatalf("bad sample: %v", err)
	}
}

func TestFitReads(t *testing.T) {
	sizes := []int64{100 << 10, 300 << 10, 1 << 20, 4 << 20}
	secs := make([]float64, len(sizes))
	for i, n := range sizes {
		secs[i] = 0.0025 + float64(n)/2e9 // 2.5 ms + 2 GB/s
	}
	gb, lat, err := FitReads(sizes, secs)
	if err != nil || math.Abs(gb-2) > 1e-9 || math.Abs(lat-2.5) > 1e-9 {
		t.Fatalf("fit %v GB/s, %v ms, %v; want 2 GB/s and 2.5 ms", gb, lat, err)
	}
	if _, _, err := FitReads([]int64{1, 2}, []float64{1, 1}); err == nil || !strings.Contains(err.Error(), "does not grow") {
		t.Fatalf("flat reads: %v", err)
	}
	if _, _, err := FitReads([]int64{1}, []float64{1}); err == nil {
		t.Fatal("one sample fitted")
	}
}

func TestFitGroupRecoversScaledRates(t *testing.T) {
	m, err := LoadModel("tiny")
	if err != nil {
		t.Fatal(err)
	}
	base := Compute{KDA: 6, MLA: 12, MLAAttention: 1.5, MoE: 9, Dense: 11}
	group := Compute{KDA: 3, MLA: 6, MLAAttention: 0.5, MoE: 4.5, Dense: 5.5} // linear x2 slower, attention x3
	cost := groupCost{rates: withOverhead(group, 0.2), model: m}
	step := 0.0015
	var samples []GroupSample
	for _, n := range []int{128, 512, 1024, 1536} {
		samples = append(samples, GroupSample{Prompt: n, Seconds: cost.Prefill(n-1, 512).Seconds() + step})
	}
	fit, err := FitGroup(m.Cfg, base, 512, step, samples)
	if err != nil {
		t.Fatal(err)
	}
	if fit.WorstError > 1e-6 || math.Abs(fit.OverheadMS-0.2) > 1e-6 || math.Abs(fit.Rates.KDA-3) > 1e-6 || math.Abs(fit.Rates.MLAAttention-0.5) > 1e-6 {
		t.Fatalf("fit %+v", fit)
	}
	if _, err := FitGroup(m.Cfg, base, 512, step, samples[:2]); err == nil {
		t.Fatal("two samples fitted three unknowns")
	}
}

func TestFitPassesRecoversScaledRates(t *testing.T) {
	m, err := LoadModel("tiny")
	if err != nil {
		t.Fatal(err)
	}
	base := Compute{KDA: 6, MLA: 12, MLAAttention: 1.5, MoE: 9, Dense: 11}
	slow := Compute{KDA: 4, MLA: 8, MLAAttention: 0.75, MoE: 6, Dense: 22.0 / 3} // linear x1.5 slower, attention x2
	var samples []PassSample
	for _, n := range []int{1, 63, 255, 1023} {
		d := PromptFLOPs(m.Cfg, 0, n).Time(slow).Seconds() + float64(m.Cfg.NumLayers)*0.3e-3
		samples = append(samples, PassSample{Tokens: n, Seconds: d})
	}
	fit, err := FitPasses(m.Cfg, base, samples)
	if err != nil {
		t.Fatal(err)
	}
	if fit.WorstResidual > 1e-6 || math.Abs(fit.OverheadMS-0.3) > 1e-6 || math.Abs(fit.Rates.KDA-4) > 1e-6 || math.Abs(fit.Rates.MLAAttention-0.75) > 1e-6 {
		t.Fatalf("fit %+v", fit)
	}
	if _, err := FitPasses(m.Cfg, base, samples[:2]); err == nil {
		t.Fatal("two samples fitted three unknowns")
	}
	if _, err := FitPasses(m.Cfg, base, []PassSample{{Tokens: 1, Seconds: 1}, {Tokens: 0, Seconds: 1}, {Tokens: 5, Seconds: 1}}); err == nil || !strings.Contains(err.Error(), "sample 1") {
		t.Fatalf("a pass of no tokens: %v", err)
	}
}

func TestFitPassesFallsBackToOneFactor(t *testing.T) {
	m, err := LoadModel("tiny")
	if err != nil {
		t.Fatal(err)
	}
	base := Compute{KDA: 6, MLA: 12, MLAAttention: 1.5, MoE: 9, Dense: 11}
	// The linear work at half the base rates and the attention free: its
	// factor fits to zero, which no machine has; one factor for both kinds
	// of work is fitted instead.
	lin := base
	lin.MLAAttention = math.Inf(1)
	var samples []PassSample
	for _, n := range []int{1, 63, 255, 1023} {
		samples = append(samples, PassSample{Tokens: n, Seconds: 2 * PromptFLOPs(m.Cfg, 0, n).Time(lin).Seconds()})
	}
	fit, err := FitPasses(m.Cfg, base, samples)
	if err != nil {
		t.Fatal(err)
	}
	f := base.KDA / fit.Rates.KDA
	if f < 1 || f > 2 || math.Abs(base.MLAAttention/fit.Rates.MLAAttention-f) > 1e-9 || !(fit.WorstResidual > 0) {
		t.Fatalf("fit %+v: want one factor between 1 and 2 on every rate, and the misfit reported", fit)
	}
	flat := []PassSample{{Tokens: 1, Seconds: 1}, {Tokens: 100, Seconds: 1}, {Tokens: 1000, Seconds: 0.5}}
	if _, err := FitPasses(m.Cfg, base, flat); err == nil || !strings.Contains(err.Error(), "does not grow") {
		t.Fatalf("times that fall with the prompt: %v", err)
	}
}
