package cpu

import (
	"fmt"
	"sort"
	"sync"

	"github.com/tandem-inference/tandem/kernels"
)

// RouterTopK is Stable LatentMoE's sigmoid router (spec §3.6): selection by
// σ(logit) + bias, weights from the unbiased scores. Ties go to the lower
// expert id so that routing is deterministic.
func (b *Backend) RouterTopK(logits *kernels.Tensor, bias []float32, k int, renorm bool, scale float32, ids []int32, weights []float32) {
	E := logits.Cols
	if len(bias) != E || len(ids) != logits.Rows*k || len(weights) != logits.Rows*k || k > E {
		panic(fmt.Sprintf("cpu.RouterTopK: logits %v, %d biases, k %d, %d ids, %d weights", logits, len(bias), k, len(ids), len(weights)))
	}
	b.parallel(logits.Rows, max(1, b.grainFor(logits.Rows)), func(lo, hi int) {
		s := make([]float32, E)
		top := make([]int32, 0, k)
		for r := lo; r < hi; r++ {
			kernelsInUse.sigmoid(s, logits.Row(r))
			top = topK(top[:0], s, bias, k)
			var sum float64
			for _, e := range top {
				sum += float64(s[e])
			}
			for j, e := range top {
				ids[r*k+j] = e
				w := float64(s[e])
				if renorm {
					w /= sum + 1e-20
				}
				weights[r*k+j] = float32(w * float64(scale))
			}
		}
	})
}

// topK returns the k experts of highest s+bias, best first, ties to the
// lower id: the first k of a full sort by that order, found by insertion
// into a list of k (the routers pick 8 or 16 of hundreds).
func topK(top []int32, s, bias []float32, k int) []int32 {
	better := func(a, b int32) bool {
		ca, cb := s[a]+bias[a], s[b]+bias[b]
		if ca != cb {
			return ca > cb
		}
		return a < b
	}
	for e := range s {
		id := int32(e)
		if len(top) == k && !better(id, top[k-1]) {
			continue
		}
		if len(top) < k {
			top = append(top, id)
		} else {
			top[k-1] = id
		}
		for i := len(top) - 1; i > 0 && better(top[i], top[i-1]); i-- {
			top[i], top[i-1] = top[i-1], top[i]
		}
	}
	return top
}

// RoutedExperts runs each selected expert over all rows routed to it (one
// expert per worker task), writes each (row, slot) result separately, then
// combines every row's slots in slot order.
func (b *Backend) RoutedExperts(u, z *kernels.Tensor, ids []int32, weights []float32, k int, experts []kernels.Expert, beta1, beta2 float32) {
	T, lat := z.Rows, z.Cols
	if u.Rows != T || u.Cols != lat || len(ids) != T*k || len(weights) != T*k {
		panic(fmt.Sprintf("cpu.RoutedExperts: u %v z %v, %d ids, %d weights, k %d", u, z, len(ids), len(weights), k))
	}
	// Slots per expert, in (row, slot) order.
	byExpert := make(map[int32][]int32)
	for slot, e := range ids {
		if e < 0 || int(e) >= len(experts) {
			panic(fmt.Sprintf("cpu.RoutedExperts: expert id %d of %d", e, len(experts)))
		}
		byExpert[e] = append(byExpert[e], int32(slot))
	}
	active := make([]int32, 0, len(byExpert))
	for e := range byExpert {
		active = append(active, e)
	}
	// Largest groups first for better balance.
	sort.Slice(active, func(i, j int) bool {
		if len(byExpert[active[i]]) != len(byExpert[active[j]]) {
			return len(byExpert[active[i]]) > len(byExpert[active[j]])
		}
		return active[i] < active[j]
	})
	ob := getF64(T * k * lat)
	defer f64Pool.Put(ob)
	out := *ob
	b.parallel(len(active), 1, func(lo, hi int) {
		s := getScratch()
		defer putScratch(s)
		for a := lo; a < hi; a++ {
			e := active[a]
			slots := byExpert[e]
			n := len(slots)
			s.f32 = grow(s.f32, n*lat)
			x := s.f32
			for i, slot := range slots {
				copy(x[i*lat:(i+1)*lat], z.Row(int(slot)/k))
			}
			s.y = grow(s.y, n*lat)
			y := s.y
			situMLPSerial(y, x, n, experts[e], beta1, beta2, s)
			for i, slot := range slots {
				copy(out[int(slot)*lat:(int(slot)+1)*lat], y[i*lat:(i+1)*lat])
			}
		}
	})
	// Each row's mixture in fp64, in slot order, rounded once.
	b.parallel(T, max(1, b.grainFor(T)), func(lo, hi int) {
		acc := make([]float64, lat)
		for r := lo; r < hi; r++ {
			clear(acc)
			for j := 0; j < k; j++ {
				w := float64(weights[r*k+j])
				src := out[(r*k+j)*lat : (r*k+j+1)*lat]
				for i, v := range src {
					acc[i] += float64(w * v)
				}
			}
			dst := u.Row(r)
			for i, v := range acc {
				dst[i] = float32(v)
			}
		}
	})
}

// f64Pool recycles large fp64 intermediates (the expert outputs of a
// prefill are megabytes per layer).
var f64Pool sync.Pool

func getF64(n int) *[]float64 {
	if b, ok := f64Pool.Get().(*[]float64); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]float64, n)
	return &b
}
