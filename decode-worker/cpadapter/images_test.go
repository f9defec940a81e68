package cpadapter

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
)

func pngOf(t *testing.T, w, h int) []byte {
	t.Helper()
	im := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			im.Set(x, y, color.NRGBA{uint8(x * 9), uint8(y * 3), 7, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, im); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestAssignmentImages: rank 0 places a local job's images on its pad runs
// with their hashes and runs the tower through Encode, once, giving rows of
// the hidden width; a remote job whose images lie in the remotely
// prefilled part needs no tower (a group without one takes it); a local
// one on a group without a tower, a run of the wrong length, and images
// on a group that takes none are refused saying so.
func TestAssignmentImages(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	c, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tw, err := vision.Load(context.Background(), cpu.New(1), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	pad := c.MediaPadID()
	img := pngOf(t, 56, 84) // 6 rows
	prompt := []int32{1, 2, pad, pad, pad, pad, pad, pad, 3, 4}
	with := &Adapter{cfg: Config{Images: imagejob.NewEncoder(c, tw, "decode group g")}, log: zap.NewNop()}
	blind := &Adapter{cfg: Config{Images: imagejob.NewEncoder(c, nil, "decode group g")}, log: zap.NewNop()}
	none := &Adapter{log: zap.NewNop()}

	req := &pipeline.Request{}
	if err := with.images(&cp.Assignment{JobID: "j", TokenIDs: prompt, Images: [][]byte{img}}, req); err != nil {
		t.Fatal(err)
	}
	if len(req.Images) != 1 || req.Images[0].At != 2 || req.Images[0].Len != 6 || req.Images[0].Hash == ([32]byte{}) || req.Encode == nil {
		t.Fatalf("local request images %+v, encode %v", req.Images, req.Encode != nil)
	}
	rows, err := req.Encode(context.Background())
	if err != nil || len(rows) != 1 || len(rows[0]) != 6*c.HiddenSize {
		t.Fatalf("encode: %d row sets, %v", len(rows), err)
	}

	remote := &cp.Assignment{JobID: "r", TokenIDs: prompt[9:], CachedTokens: 9, CachedTokenIDs: prompt[:9], Images: [][]byte{img}}
	req = &pipeline.Request{}
	if err := blind.images(remote, req); err != nil || req.Encode != nil || len(req.Images) != 1 {
		t.Fatalf("remote job on a group without a tower: %v, %+v", err, req.Images)
	}

	for _, tc := range []struct {
		a    *Adapter
		as   *cp.Assignment
		want string
	}{
		{blind, &cp.Assignment{JobID: "j", TokenIDs: prompt, Images: [][]byte{img}}, "no vision tower"},
		{with, &cp.Assignment{JobID: "j", TokenIDs: prompt[3:], Images: [][]byte{img}}, "has 6 feature rows, the prompt holds 5 pad"},
		{with, &cp.Assignment{JobID: "j", TokenIDs: append([]int32{pad, 1}, prompt...), Images: [][]byte{img}}, "holds 2 runs"},
		{none, &cp.Assignment{JobID: "j", TokenIDs: prompt, Images: [][]byte{img}}, "takes none"},
	} {
		if err := tc.a.images(tc.as, &pipeline.Request{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
}
