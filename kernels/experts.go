package kernels

import "fmt"

// ExpertGroups is a device backend's launch plan for RoutedExperts: the
// T·k (row, slot) pairs grouped by expert, so that each used expert runs
// once over all its rows.
type ExpertGroups struct {
	Experts []int   // used experts, ascending
	Offs    []int32 // group bounds in grouped rows, len(Experts)+1
	Order   []int32 // token row of each grouped row
	Pos     []int32 // grouped row of each (row, slot)
	MaxRows int     // the largest group
}

// GroupExperts groups the (row, slot) pairs of ids [T, k] by expert, in
// slot order within an expert. An id outside [0, nExperts) is a
// programmer error (the router made it) and panics.
func GroupExperts(ids []int32, k, nExperts int) ExpertGroups {
	count := make([]int, nExperts)
	for _, e := range ids {
		if e < 0 || int(e) >= nExperts {
			panic(fmt.Sprintf("RoutedExperts: expert id %d outside [0, %d)", e, nExperts))
		}
		count[e]++
	}
	var p ExpertGroups
	start := make([]int, nExperts)
	off := 0
	for e, c := range count {
		if c == 0 {
			continue
		}
		p.Experts = append(p.Experts, e)
		p.Offs = append(p.Offs, int32(off))
		start[e] = off
		off += c
		p.MaxRows = max(p.MaxRows, c)
	}
	p.Offs = append(p.Offs, int32(off))
	p.Order = make([]int32, len(ids))
	p.Pos = make([]int32, len(ids))
	for slot, e := range ids {
		i := start[e]
		start[e]++
		p.Pos[slot] = int32(i)
		p.Order[i] = int32(slot / k)
	}
	return p
}
