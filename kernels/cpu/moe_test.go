package cpu

import (
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/tandem-inference/tandem/kernels"
)

// TestTopKMatchesSort: the router's selection returns the first k of the
// full sort it replaced (by s+bias descending, ties to the lower id), with
// many ties.
func TestTopKMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := 0; trial < 200; trial++ {
		E := 1 + rng.IntN(300)
		k := 1 + rng.IntN(E)
		s, bias := make([]float32, E), make([]float32, E)
		for e := range s {
			s[e] = float32(rng.IntN(7)) / 8 // coarse: ties are common
			bias[e] = float32(rng.IntN(3)) / 4
		}
		order := make([]int32, E)
		for e := range order {
			order[e] = int32(e)
		}
		sort.Slice(order, func(i, j int) bool {
			ci, cj := s[order[i]]+bias[order[i]], s[order[j]]+bias[order[j]]
			if ci != cj {
				return ci > cj
			}
			return order[i] < order[j]
		})
		got := topK(nil, s, bias, k)
		for j := 0; j < k; j++ {
			if got[j] != order[j] {
				t.Fatalf("E=%d k=%d: position %d is expert %d, sort gives %d", E, k, j, got[j], order[j])
			}
		}
	}
}

// refRoutedExperts is the definition of RoutedExperts: per row and slot in
// order, the expert's SiTU-GLU (reference GEMMs, fp64 hidden), weighted and
// summed in fp64, rounded once.
func refRoutedExperts(z *kernels.Tensor, ids []int32, weights []float32, k int, experts []kernels.Expert, beta1, beta2 float32) []float32 {
	T, lat := z.Rows, z.Cols
	out := make([]float32, T*lat)
	for r := 0; r < T; r++ {
		acc := make([]float64, lat)
		for j := 0; j < k; j++ {
			e := experts[ids[r*k+j]]
			g := refGemm[float32, float64](z.Row(r), 1, e.W1)
			u := refGemm[float32, float64](z.Row(r), 1, e.W3)
			for i := range g {
				g[i] = situ(g[i], u[i], float64(beta1), float64(beta2))
			}
			y := refGemm[float64, float64](g, 1, e.W2)
			for i, v := range y {
				acc[i] += float64(weights[r*k+j]) * v
			}
		}
		for i, v := range acc {
			out[r*lat+i] = float32(v)
		}
	}
	return out
}

// TestRoutedExpertsMatchesDefinition: experts shared by several rows, rows
// whose experts repeat across the batch, MXFP4 and BF16 experts; every row
// equals the per-row definition bit for bit, for 1 and 3 threads.
func TestRoutedExpertsMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	const E, lat, inter, k = 12, 64, 96, 3
	for _, f := range []kernels.Format{kernels.MXFP4, kernels.BF16} {
		experts := make([]kernels.Expert, E)
		for e := range experts {
			experts[e] = kernels.Expert{
				W1: randMatrix(rng, f, inter, lat, 122, 128),
				W3: randMatrix(rng, f, inter, lat, 122, 128),
				W2: randMatrix(rng, f, lat, inter, 122, 128),
			}
		}
		for _, T := range []int{1, 2, 9, 40} {
			z := randTensor(rng, T, lat, rng.NormFloat64)
			ids := make([]int32, T*k)
			wts := make([]float32, T*k)
			for r := 0; r < T; r++ {
				perm := rng.Perm(E)
				for j := 0; j < k; j++ {
					ids[r*k+j] = int32(perm[j] % (E / 2 * (1 + r%2))) // skewed: some experts get many rows
					for jj := 0; jj < j; jj++ {
						if ids[r*k+jj] == ids[r*k+j] {
							ids[r*k+j] = int32((int(ids[r*k+j]) + 1 + jj) % E)
						}
					}
					wts[r*k+j] = rng.Float32()
				}
			}
			want := refRoutedExperts(z, ids, wts, k, experts, 4, 25)
			for _, kn := range kernelSets() {
				useKernels(t, kn)
				for _, threads := range []int{1, 3} {
					u := New(threads).NewTensor(T, lat)
					New(threads).RoutedExperts(u, z, ids, wts, k, experts, 4, 25)
					if i := sameF32(u.Data, want); i >= 0 {
						t.Fatalf("%s %s T=%d threads %d: u[%d][%d] = %g, want %g", f, kn.name, T, threads, i/lat, i%lat, u.Data[i], want[i])
					}
				}
			}
		}
	}
}
