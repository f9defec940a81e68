package imagejob_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testimage"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// prompt is text, a run of pads per image, text.
func prompt(pad int32, runs ...int) []int32 {
	p := []int32{1, 2, 3}
	for _, n := range runs {
		for range n {
			p = append(p, pad)
		}
		p = append(p, 4, 5)
	}
	return p
}

// TestPrepareAndFeatures: images are decoded, placed on their runs and
// run through the tiny checkpoint's tower once, rows of the text width at
// the runs' positions; a run of the wrong length, a count of runs that is
// not the images', and a corrupt file are refused saying which image and
// why; a worker without a tower refuses the job.
func TestPrepareAndFeatures(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	c, err := model.LoadConfig(dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	tw, err := vision.Load(context.Background(), cpu.New(2), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	e := imagejob.NewEncoder(c, tw, "prefill worker p1")
	a, b := testimage.PNG(t, 56, 84, 1), testimage.PNG(t, 30, 20, 2) // 2x3 rows; padded to 56x28, 2x1
	p := prompt(e.Pad, 6, 2)
	j, err := e.Prepare(p, [][]byte{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if j.Runs[0].Lo != 3 || j.Runs[0].Len() != 6 || j.Runs[1].Len() != 2 {
		t.Fatalf("runs %v", j.Runs)
	}
	feats, err := e.Features(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	if e.Rate() <= 0 {
		t.Fatalf("no tower rate measured after a run: %v", e.Rate())
	}
	md := j.Media(feats, 10)
	if len(md) != 2 || md[0].At != 13 || md[0].Len(c.HiddenSize) != 6 || md[1].Len(c.HiddenSize) != 2 {
		t.Fatalf("media %+v", md)
	}
	if k := j.Keys(10); k[1].At != j.Runs[1].Lo+10 || k[0].Hash == k[1].Hash {
		t.Fatalf("keys %+v", k)
	}

	for _, tc := range []struct {
		p    []int32
		imgs [][]byte
		want string
	}{
		{prompt(e.Pad, 5, 2), [][]byte{a, b}, "image 1 (56x84) has 6 feature rows, the prompt holds 5 pad tokens"},
		{prompt(e.Pad, 6), [][]byte{a, b}, "the job has 2 images, its prompt holds 1 runs"},
		{prompt(e.Pad, 6, 2), [][]byte{a, b[:40]}, "image 2"},
	} {
		if _, err := e.Prepare(tc.p, tc.imgs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("want %q, got %v", tc.want, err)
		}
	}
	blind := imagejob.NewEncoder(c, nil, "decode group g1")
	if err := blind.CheckTower(j); !errors.Is(err, imagejob.ErrNoTower) || !strings.Contains(err.Error(), "decode group g1") {
		t.Fatalf("no tower: %v", err)
	}
	if n, err := imagejob.WeightBytes(dir); err != nil || n == 0 {
		t.Fatalf("tower weights: %d bytes, %v", n, err)
	}
}
