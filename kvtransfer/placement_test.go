package kvtransfer

import (
	"slices"
	"testing"

	"github.com/tandem-inference/tandem/model"
)

func TestContiguous(t *testing.T) {
	m, err := Contiguous(93, []string{"a", "b", "c", "d"})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{len(m.Layers("a")), len(m.Layers("b")), len(m.Layers("c")), len(m.Layers("d"))}
	if !slices.Equal(sizes, []int{24, 23, 23, 23}) || m[0] != "a" || m[23] != "a" || m[24] != "b" || m[92] != "d" {
		t.Fatalf("split %v", sizes)
	}
	if eps := m.Endpoints(); !slices.Equal(eps, []string{"a", "b", "c", "d"}) {
		t.Fatalf("endpoints %v", eps)
	}
	if _, err := Contiguous(2, []string{"a", "b", "c"}); err == nil {
		t.Fatal("more ranks than layers accepted")
	}
	if _, err := m.Routes(93, model.PartLatent, 10, nil); err == nil {
		t.Fatal("route for a layer outside the placement")
	}
	rs, err := m.Routes(30, model.PartKDAState, 100, []int{5, 5})
	if err != nil || len(rs) != 1 || rs[0].Endpoint != "b" || rs[0].Off != 0 || rs[0].Len != 100 || rs[0].Shape != nil {
		t.Fatalf("routes %v %v", rs, err)
	}
}
