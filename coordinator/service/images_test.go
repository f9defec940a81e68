package service

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/png"
	"slices"
	"strings"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// imageCoordinator is a coordinator (no NATS, no workers) that admits
// submissions for the demo model; vision says whether the model reads
// images.
func imageCoordinator(t *testing.T, vision bool, lim images.Limits) *Coordinator {
	t.Helper()
	dir := testmodel.Dir(t, "demo", 1, 2)
	info, err := modelinfo.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	info.Vision = vision
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Model: info, Tokenizer: tok, Images: lim}
	if cfg, err = cfg.withDefaults(); err != nil {
		t.Fatal(err)
	}
	return &Coordinator{cfg: cfg, view: newView()}
}

func pngBytes(t *testing.T, w, h int) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestAdmitImages: a NATS submission's images are checked as the HTTP
// front door checks them: the model must read images, each is sized from
// its header, a chat gets its markers with one pad per feature row, and
// token ids must hold one pad run per image of its rows.
func TestAdmitImages(t *testing.T) {
	c := imageCoordinator(t, true, images.Limits{PerRequest: 2, Pixels: 1 << 20})
	img := pngBytes(t, 60, 30) // 84x56 padded: 3x2 feature rows
	chat := &cp.SubmitRequest{Images: [][]byte{img}, Messages: []cp.ChatMessage{{Role: "user",
		Parts: []cp.ContentPart{{Type: cp.PartText, Text: "What is this?"}, {Type: cp.PartImage}}}}}
	out, err := c.admit(chat)
	if err != nil {
		t.Fatal(err)
	}
	pad, _ := c.cfg.Tokenizer.SpecialID(tokenizer.MediaPad)
	if n := countID(out.TokenIDs, int32(pad)); n != 6 || len(out.Images) != 1 || !bytes.Equal(out.Images[0], img) {
		t.Fatalf("stored %d pad ids and %d images, want 6 and the image", n, len(out.Images))
	}
	want, err := c.cfg.Tokenizer.EncodeChat(&tokenizer.Chat{Messages: []tokenizer.ChatMessage{{Role: "user",
		Content: []byte(`[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"x"}}]`)}},
		Images: []tokenizer.ChatImage{{Width: 60, Height: 30, Rows: 6}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(toInts(out.TokenIDs), want) {
		t.Error("the NATS chat's prompt differs from the HTTP front door's rendering")
	}

	// The same prompt as token ids, with its image.
	ids := &cp.SubmitRequest{TokenIDs: out.TokenIDs, Images: [][]byte{img}}
	if _, err := c.admit(ids); err != nil {
		t.Fatalf("token ids with their image: %v", err)
	}

	// A 1x1 PNG whose IHDR says 20000 x 20000 (its checksum redone).
	bomb := append([]byte(nil), pngBytes(t, 1, 1)...)
	binary.BigEndian.PutUint32(bomb[16:], 20000)
	binary.BigEndian.PutUint32(bomb[20:], 20000)
	binary.BigEndian.PutUint32(bomb[29:], crc32.ChecksumIEEE(bomb[12:29]))
	for _, tc := range []struct {
		name string
		c    *Coordinator
		req  *cp.SubmitRequest
		code cp.ErrorCode
		want string
	}{
		{"no vision tower", imageCoordinator(t, false, images.Limits{}), chat, cp.CodeBadRequest, "has no vision tower"},
		{"garbage", c, withImages(chat, []byte("not an image at all")), cp.CodeBadRequest, "image #1"},
		{"too many", c, &cp.SubmitRequest{TokenIDs: []int32{1}, Images: [][]byte{img, img, img}}, cp.CodeTooLarge, "3 images, at most 2"},
		{"bomb header", c, withImages(chat, bomb), cp.CodeTooLarge, "20000x20000"},
		{"short pad run", c, &cp.SubmitRequest{TokenIDs: slices.DeleteFunc(slices.Clone(out.TokenIDs), onePad(int32(pad))), Images: [][]byte{img}},
			cp.CodeBadRequest, "image #1: has 6 feature rows, the prompt holds 5 pad tokens"},
		{"no pad run", c, &cp.SubmitRequest{TokenIDs: []int32{1, 2, 3}, Images: [][]byte{img}}, cp.CodeBadRequest, "1 images are given for 0 runs"},
	} {
		_, err := tc.c.admit(tc.req)
		var re *cp.RemoteError
		if !errors.As(err, &re) || re.Code != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %s mentioning %q", tc.name, err, tc.code, tc.want)
		}
	}
}

func withImages(r *cp.SubmitRequest, imgs ...[]byte) *cp.SubmitRequest {
	out := *r
	out.Images = imgs
	return &out
}

// onePad matches the first pad id only.
func onePad(pad int32) func(int32) bool {
	done := false
	return func(id int32) bool {
		if id == pad && !done {
			done = true
			return true
		}
		return false
	}
}

func countID(ids []int32, id int32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

func toInts(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}
