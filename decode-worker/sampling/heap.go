package sampling

// minHeap holds token ids with the least likely at the root: a is above b
// when its logit is larger, or equal with a lower id.
type minHeap struct {
	logits []float32
	ids    []int32
}

func (h *minHeap) above(a, b int32) bool {
	la, lb := h.logits[a], h.logits[b]
	return la > lb || la == lb && a < b
}

func (h *minHeap) push(id int32) {
	h.ids = append(h.ids, id)
	i := len(h.ids) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.above(h.ids[p], h.ids[i]) {
			break
		}
		h.ids[p], h.ids[i] = h.ids[i], h.ids[p]
		i = p
	}
}

func (h *minHeap) down(i int) {
	n := len(h.ids)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.above(h.ids[l], h.ids[r]) {
			m = r
		}
		if !h.above(h.ids[i], h.ids[m]) {
			return
		}
		h.ids[i], h.ids[m] = h.ids[m], h.ids[i]
		i = m
	}
}

// maxHeap holds candidate positions with the heaviest at the root (ties:
// the lower token id), so that popping yields descending probability.
type maxHeap struct {
	w   []float64 // weight of each position
	ids []int32   // token id of each position
	pos []int32
}

func (h *maxHeap) before(a, b int32) bool {
	wa, wb := h.w[a], h.w[b]
	return wa > wb || wa == wb && h.ids[a] < h.ids[b]
}

func (h *maxHeap) init() {
	for i := len(h.pos)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *maxHeap) pop() int32 {
	top := h.pos[0]
	n := len(h.pos) - 1
	h.pos[0] = h.pos[n]
	h.pos = h.pos[:n]
	h.down(0)
	return top
}

func (h *maxHeap) down(i int) {
	n := len(h.pos)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.before(h.pos[r], h.pos[l]) {
			m = r
		}
		if !h.before(h.pos[m], h.pos[i]) {
			return
		}
		h.pos[i], h.pos[m] = h.pos[m], h.pos[i]
		i = m
	}
}
