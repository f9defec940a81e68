package kernels

import (
	"reflect"
	"testing"
)

func TestGroupExperts(t *testing.T) {
	// 3 rows, k 2: row 0 -> experts 4, 1; row 1 -> 1, 0; row 2 -> 4, 0.
	p := GroupExperts([]int32{4, 1, 1, 0, 4, 0}, 2, 6)
	if !reflect.DeepEqual(p.Experts, []int{0, 1, 4}) || !reflect.DeepEqual(p.Offs, []int32{0, 2, 4, 6}) || p.MaxRows != 2 {
		t.Fatalf("experts %v offs %v max %d", p.Experts, p.Offs, p.MaxRows)
	}
	// Grouped rows: expert 0 gets slots 3, 5 (rows 1, 2); expert 1 slots 1, 2
	// (rows 0, 1); expert 4 slots 0, 4 (rows 0, 2).
	if !reflect.DeepEqual(p.Order, []int32{1, 2, 0, 1, 0, 2}) {
		t.Errorf("order %v", p.Order)
	}
	if !reflect.DeepEqual(p.Pos, []int32{4, 2, 3, 0, 5, 1}) {
		t.Errorf("pos %v", p.Pos)
	}
	for slot, g := range p.Pos {
		if p.Order[g] != int32(slot/2) {
			t.Errorf("slot %d: grouped row %d holds row %d", slot, g, p.Order[g])
		}
	}
}
