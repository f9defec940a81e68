package main

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// TestTensorStageMatchesOneRank: generate --tensor 2 (ranks in process,
// each loading its slices) and a measured stage of 2 ranks over the
// collective's kvtransfer channels, on loopback TCP and on the RDMA link
// (fake verbs wire), generate the ids of one rank.
func TestTensorStageMatchesOneRank(t *testing.T) {
	ctx := context.Background()
	dir := testmodel.Dir(t, "tiny", 1, 1)
	m, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want, err := m.Generate(ctx, []int32{5, 17, 200}, 6)
	if err != nil {
		t.Fatal(err)
	}
	mf := &modelFlags{dir: dir, ids: "5,17,200", threads: 1, cache: "bf16"}
	got, err := generateTensor(ctx, mf, 6, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("generate --tensor 2: %v, one rank %v", got, want)
	}
	tb := tensorBench{mf: mf, tensor: 2, seqs: []int{1, 3}, prompt: 4, tokens: 4}
	one, err := tb.stage(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	trs := []string{"tcp", "rdma-fake"}
	if testing.Short() && os.Getenv("KVTRANSFER_TRANSPORT") != "rdma-fake" {
		trs = trs[:1] // as decode-worker/collective's TestChannels
	}
	for _, tr := range trs {
		tb.transport = tr
		two, err := tb.stage(ctx, 2)
		if err != nil {
			t.Fatalf("%s: %v", tr, err)
		}
		for i := range one {
			if !slices.Equal(one[i].IDs, two[i].IDs) || two[i].Reductions == 0 {
				t.Fatalf("%s, %d sequences: tensor 2 %v (%.0f reductions a step), one rank %v", tr, one[i].Sequences, two[i].IDs, two[i].Reductions, one[i].IDs)
			}
		}
	}
}

// TestGenerateStagesMatchesOneRank: generate --pipeline P --tensor 2, the
// stages handing activations on in memory, each rank binding only its
// layers' slices, generates one rank's ids.
func TestGenerateStagesMatchesOneRank(t *testing.T) {
	ctx := context.Background()
	dir := testmodel.Dir(t, "tiny", 1, 1)
	m, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt := []int32{5, 17, 200, 9, 44}
	want, err := m.Generate(ctx, prompt, 6)
	if err != nil {
		t.Fatal(err)
	}
	mf := &modelFlags{dir: dir, ids: "5,17,200,9,44", threads: 1, cache: "bf16"}
	for _, P := range []int{2, 3} {
		got, err := generateStages(ctx, mf, 6, P, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("pipeline %d x tensor 2: %v, one rank %v", P, got, want)
		}
	}
}
