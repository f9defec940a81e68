package rank

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model"
)

func config(t *testing.T, name string) *model.Config {
	t.Helper()
	b, err := configs.ModelPreset(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLayoutValidate(t *testing.T) {
	l, err := Even("g", 9, []string{"a:1", "b:2", "c:3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Validate(9); err != nil {
		t.Fatal(err)
	}
	if l.Ranks[0].Hi != 3 || l.Ranks[2].Lo != 6 || l.Owner(4) != 1 || l.Owner(9) != -1 {
		t.Fatalf("even split: %+v", l.Ranks)
	}
	if r, _ := Split(17, 3); r[0] != [2]int{0, 6} || r[1] != [2]int{6, 12} || r[2] != [2]int{12, 17} {
		t.Fatalf("split 17/3: %v", r)
	}
	for _, tc := range []struct {
		mod  func(*Layout)
		want string
	}{
		{func(l *Layout) { l.Group = "" }, "group name"},
		{func(l *Layout) { l.Ranks = nil }, "no ranks"},
		{func(l *Layout) { l.Ranks[1].Endpoint = "nohost" }, "endpoint"},
		{func(l *Layout) { l.Ranks[2].Endpoint = "a:1" }, "share endpoint"},
		{func(l *Layout) { l.Ranks[1].Lo = 4 }, "do not continue"},
		{func(l *Layout) { l.Ranks[1].Hi = 3 }, "do not continue"},
		{func(l *Layout) { l.Ranks[2].Hi = 8 }, "model has 9"},
		{func(l *Layout) { l.Ranks[0].MemoryBudget = -1 }, "negative"},
	} {
		l, _ := Even("g", 9, []string{"a:1", "b:2", "c:3"})
		tc.mod(l)
		if err := l.Validate(9); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
	if _, err := Split(2, 3); err == nil {
		t.Error("2 layers split over 3 ranks")
	}
}

// TestStateBytes: the reservation equals what the states really take at
// capacity, for every layer range.
func TestStateBytes(t *testing.T) {
	for _, name := range []string{"tiny", "small"} {
		c := config(t, name)
		for _, dt := range []model.DType{model.BF16, model.F32} {
			for lo := 0; lo < c.NumLayers; lo += 4 {
				hi := min(lo+5, c.NumLayers)
				st := c.NewSeqState(lo, hi, model.StateOptions{LatentDType: dt, LatentCapacity: 300})
				var n int64
				for _, ls := range st.Layers {
					if ls == nil {
						continue
					}
					for _, p := range ls.Parts {
						n += int64(cap(p.Data))
					}
				}
				if got := StateBytes(c, lo, hi, 300, dt); got != n {
					t.Fatalf("%s %s [%d, %d): StateBytes %d, states take %d", name, dt, lo, hi, got, n)
				}
			}
		}
	}
}

func TestTableAccounting(t *testing.T) {
	c := config(t, "tiny")
	per := StateBytes(c, 0, 5, 100, model.BF16)
	tb := NewTable(c, 0, 5, 2*per+per/2, model.StateOptions{})
	a, err := tb.Admit("a", 100)
	if err != nil {
		t.Fatal(err)
	}
	tb.Create(a)
	if a.State == nil || a.State.Layers[4] == nil || a.State.Layers[5] != nil {
		t.Fatal("created state does not hold exactly the rank's layers")
	}
	if _, err := tb.Admit("a", 100); err == nil {
		t.Fatal("duplicate admitted")
	}
	if _, err := tb.Admit("b", 100); err != nil {
		t.Fatal(err)
	}
	_, err = tb.Admit("c", 100)
	if !errors.Is(err, ErrNoMemory) || !strings.Contains(err.Error(), "layers [0, 5)") {
		t.Fatalf("over budget: %v", err)
	}
	if tb.Used() != 2*per || tb.Len() != 2 {
		t.Fatalf("used %d, want %d; %d sequences", tb.Used(), 2*per, tb.Len())
	}
	if !tb.Free("a") || tb.Free("a") {
		t.Fatal("free twice")
	}
	if _, err := tb.Admit("c", 100); err != nil {
		t.Fatal(err)
	}
	tb.Free("b")
	tb.Free("c")
	if tb.Used() != 0 || tb.Len() != 0 {
		t.Fatalf("after freeing all: %d bytes, %d sequences", tb.Used(), tb.Len())
	}
	if _, err := tb.Admit("z", 0); err == nil {
		t.Fatal("zero capacity admitted")
	}
}

func TestVerify(t *testing.T) {
	c := config(t, "tiny")
	good := func() *model.SeqState {
		st := &model.SeqState{Tokens: 7, Layers: make([]*model.LayerState, c.NumLayers)}
		for L := 2; L < 6; L++ {
			ls := &model.LayerState{Layer: L, Kind: c.LayerKind(L), Parts: c.ExpectedParts(L, 7, model.BF16)}
			for i := range ls.Parts {
				ls.Parts[i].Data = make([]byte, ls.Parts[i].Elems()*ls.Parts[i].DType.Size())
			}
			st.Layers[L] = ls
		}
		return st
	}
	if err := Verify(c, good(), 2, 6, 7, model.BF16); err != nil {
		t.Fatal(err)
	}
	mla, kda := -1, -1
	for L := 2; L < 6; L++ {
		if c.LayerKind(L) == model.MLA && mla < 0 {
			mla = L
		}
		if c.LayerKind(L) == model.KDA && kda < 0 {
			kda = L
		}
	}
	if mla < 0 || kda < 0 {
		t.Fatal("tiny layers 2..5 hold both kinds")
	}
	for _, tc := range []struct {
		mod  func(*model.SeqState)
		want string
	}{
		{func(s *model.SeqState) { s.Tokens = 6 }, "6 cached tokens"},
		{func(s *model.SeqState) { s.Layers[3] = nil }, "layer 3 is missing"},
		{func(s *model.SeqState) { s.Layers[0] = s.Layers[2] }, "layer 0 is not on this rank"},
		{func(s *model.SeqState) { s.Layers = s.Layers[:5] }, "layer slots"},
		{func(s *model.SeqState) { s.Layers[mla].Parts[0].Shape = []int{8, c.LatentWidth()} }, "expected"},
		{func(s *model.SeqState) { s.Layers[mla].Parts[0].Data = s.Layers[mla].Parts[0].Data[1:] }, "bytes"},
		{func(s *model.SeqState) { s.Layers[kda].Parts = s.Layers[kda].Parts[:3] }, "3 parts"},
		{func(s *model.SeqState) { s.Layers[kda].Kind = model.MLA }, "labelled"},
		{func(s *model.SeqState) { s.Layers[kda].Part(model.PartConvK).F32()[5] = float32(math.Inf(1)) }, "conv_k element 5 is +Inf"},
		{func(s *model.SeqState) { s.Layers[mla].Parts[0].U16()[3] = 0x7fc0 }, "mla_latent element 3 is NaN"},
	} {
		st := good()
		tc.mod(st)
		if err := Verify(c, st, 2, 6, 7, model.BF16); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q: %v", tc.want, err)
		}
	}
	if err := Verify(c, nil, 2, 6, 7, model.BF16); err == nil {
		t.Error("nil state verified")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 29: "1.5 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestLayoutTensor: a 2 x 2 layout numbers ranks stage-major, gives a
// stage's ranks its layers and their shards, and refuses partial stages,
// stage ranks on different layers and tensor sizes the heads refuse.
func TestLayoutTensor(t *testing.T) {
	eps := []string{"a:1", "b:1", "c:1", "d:1"}
	l, err := EvenTensor("g", 9, eps, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Validate(9); err != nil {
		t.Fatal(err)
	}
	if l.Stages() != 2 || l.Ranks[1].Hi != 5 || l.Ranks[2].Lo != 5 || l.Owner(6) != 2 {
		t.Fatalf("2 x 2 layout: %+v", l.Ranks)
	}
	if s, tr := l.StageOf(3); s != 1 || tr != 1 || l.Shard(3) != (model.Shard{Rank: 1, Ranks: 2}) || !l.HoldsHead(3) || l.HoldsEmbed(3) || !l.HoldsEmbed(1) {
		t.Fatalf("rank 3: stage %d tensor %d shard %v", s, tr, l.Shard(3))
	}
	l.Ranks[1].Hi = 4
	if err := l.Validate(9); err == nil || !strings.Contains(err.Error(), "share its layers") {
		t.Errorf("stage ranks on different layers: %v", err)
	}
	if _, err := EvenTensor("g", 9, eps[:3], 2); err == nil || !strings.Contains(err.Error(), "whole stages") {
		t.Errorf("3 ranks of tensor 2: %v", err)
	}
	l3 := &Layout{Group: "g", Tensor: 2, Ranks: []Spec{{Endpoint: "a:1", Lo: 0, Hi: 9}, {Endpoint: "b:1", Lo: 0, Hi: 9}, {Endpoint: "c:1", Lo: 0, Hi: 9}}}
	if err := l3.Validate(9); err == nil || !strings.Contains(err.Error(), "whole stages") {
		t.Errorf("3 ranks of tensor 2: %v", err)
	}
	small := config(t, "small")
	l4, _ := EvenTensor("g", small.NumLayers, eps, 4)
	if err := l4.CheckModel(small); err == nil || !strings.Contains(err.Error(), "does not divide the model's 6 KDA heads") {
		t.Errorf("tensor 4 of 6 heads: %v", err)
	}
	l2, _ := EvenTensor("g", small.NumLayers, eps[:3], 3)
	if err := l2.CheckModel(small); err != nil {
		t.Errorf("tensor 3 of 6 heads, 512 experts: %v", err)
	}
}

// TestShardStateBytes: a tensor rank's reservation equals what its states
// take: its KDA heads' share, the whole MLA cache.
func TestShardStateBytes(t *testing.T) {
	c := config(t, "small")
	for _, T := range []int{2, 3} {
		s := model.Shard{Rank: 1, Ranks: T}
		st := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.BF16, LatentCapacity: 100, Shard: s})
		var n int64
		for _, ls := range st.Layers {
			for _, p := range ls.Parts {
				n += int64(cap(p.Data))
			}
		}
		if got := ShardStateBytes(c, 0, c.NumLayers, 100, model.BF16, s); got != n {
			t.Fatalf("tensor %d: ShardStateBytes %d, states take %d", T, got, n)
		}
		if whole := StateBytes(c, 0, c.NumLayers, 100, model.BF16); n >= whole {
			t.Fatalf("tensor %d: a rank's state %d is not below the whole %d", T, n, whole)
		}
	}
}

// TestVerifyShard: a tensor rank's slice of a state (model.ShardSeqState)
// passes its checks after the wire encoding, and a whole state, which a
// sender should not ship to a tensor rank, is refused naming the part.
func TestVerifyShard(t *testing.T) {
	c := config(t, "small")
	full := c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: model.BF16})
	for _, ls := range full.Layers {
		if p := ls.Part(model.PartLatent); p != nil {
			p.Data = make([]byte, 3*p.Shape[1]*2)
			p.Shape[0] = 3
		}
	}
	full.Tokens = 3
	s := model.Shard{Rank: 1, Ranks: 3}
	slice, err := c.ShardSeqState(full, s)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := slice.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got model.SeqState
	if err := got.UnmarshalBinary(wire); err != nil {
		t.Fatal(err)
	}
	if err := VerifyShard(c, &got, 0, c.NumLayers, 3, model.BF16, s); err != nil {
		t.Fatalf("the rank's slice: %v", err)
	}
	if err := VerifyShard(c, full, 0, c.NumLayers, 3, model.BF16, s); err == nil || !strings.Contains(err.Error(), "kda_state") {
		t.Fatalf("a whole state on a tensor rank: %v", err)
	}
}

// TestTableInstallsSlices: a tensor rank's table installs its own slice of
// a remote state and refuses the whole state, naming its shard, the layer
// and both shapes, and installing nothing.
func TestTableInstallsSlices(t *testing.T) {
	c := config(t, "small")
	s := model.Shard{Rank: 1, Ranks: 2}
	lo, hi := 0, c.NumLayers/2
	const T = 5
	whole := c.NewSeqState(lo, hi, model.StateOptions{LatentDType: model.BF16, LatentCapacity: T})
	for _, ls := range whole.Layers {
		if ls == nil {
			continue
		}
		if p := ls.Part(model.PartLatent); p != nil {
			p.Data = make([]byte, T*p.Shape[1]*2)
			p.Shape[0] = T
		}
	}
	whole.Tokens = T
	tb := NewTable(c, lo, hi, 0, model.StateOptions{LatentDType: model.BF16, Shard: s})
	e, err := tb.Admit("a", T)
	if err != nil {
		t.Fatal(err)
	}
	err = tb.Install(e, whole, T)
	kda := c.KDALayers[0]
	for _, want := range []string{"tensor rank 1 of 2 of layers [0, ", fmt.Sprintf("layer %d part 0 is kda_state F32 [%d", kda, c.KDAHeads),
		fmt.Sprintf("expected kda_state F32 [%d", c.KDAHeads/2)} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("a whole state installed on %s: %v (want %q)", s, err, want)
		}
	}
	if e.State != nil {
		t.Fatal("a refused state was installed")
	}
	slice, err := c.ShardSeqState(whole, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Install(e, slice, T); err != nil || e.State != slice {
		t.Fatalf("the rank's own slice: %v", err)
	}
}
