package openai_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// pngImage encodes a w x h gradient.
func pngImage(t testing.TB, w, h int) []byte {
	t.Helper()
	im := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			im.Set(x, y, color.NRGBA{uint8(7 * x), uint8(5 * y), uint8(x ^ y), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, im); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// noisePNG is a w x h PNG of random pixels, which no PNG compresses.
func noisePNG(t testing.TB, w, h int) []byte {
	t.Helper()
	im := image.NewNRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range im.Pix {
		im.Pix[i] = uint8(r.Uint32())
	}
	var b bytes.Buffer
	if err := png.Encode(&b, im); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pngDeclaring is a PNG whose header declares w x h RGBA pixels and whose
// data is empty: a few dozen bytes that would decode to w*h*4.
func pngDeclaring(w, h uint32) []byte {
	chunk := func(typ string, data []byte) []byte {
		var b bytes.Buffer
		_ = binary.Write(&b, binary.BigEndian, uint32(len(data)))
		b.WriteString(typ)
		b.Write(data)
		_ = binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(typ), data...)))
		return b.Bytes()
	}
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 6
	out := append([]byte("\x89PNG\r\n\x1a\n"), chunk("IHDR", ihdr)...)
	out = append(out, chunk("IDAT", nil)...)
	return append(out, chunk("IEND", nil)...)
}

func dataURL(mediaType string, b []byte) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(b)
}

// imageChat is a chat body of one user turn: text, then an image_url part
// per url.
func imageChat(text string, urls ...string) map[string]any {
	parts := []any{map[string]any{"type": "text", "text": text}}
	for _, u := range urls {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u, "detail": "high"}})
	}
	return map[string]any{"model": modelName, "max_tokens": 2, "reasoning_effort": "none",
		"messages": []any{map[string]any{"role": "user", "content": parts}}}
}

// frontDoor is a front door on the demo model with a stand-in for the
// coordinators behind it: it says a decode group serves the model, and
// refuses every submission (bad_request, its own message) after handing
// it to the test on the returned channel. A request the front door's
// checks let through is answered with that refusal; one they refuse gets
// its own answer before anything is submitted.
func frontDoor(t *testing.T, vision bool, mod func(*openai.Config)) (string, <-chan cp.SubmitRequest) {
	t.Helper()
	return frontDoorOn(t, natstest.Server(t), vision, mod)
}

// frontDoorOn is frontDoor on the NATS server at url.
func frontDoorOn(t *testing.T, url string, vision bool, mod func(*openai.Config)) (string, <-chan cp.SubmitRequest) {
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
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got := make(chan cp.SubmitRequest, 16)
	_, err = cp.Serve(t.Context(), nc, cp.SubjectAllAvailability, "", func(context.Context, *cp.AvailabilityRequest) (*cp.AvailabilityReply, error) {
		return &cp.AvailabilityReply{Model: info.ID, DecodeGroups: 1, DecodeRanks: 1, MaxTokens: info.MaxPositions}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cp.Serve(t.Context(), nc, cp.SubjectAllSubmit, "", func(_ context.Context, r *cp.SubmitRequest) (*cp.SubmitReply, error) {
		got <- *r
		return nil, &cp.RemoteError{Code: cp.CodeBadRequest, Message: "the test's stand-in coordinator saw the job"}
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := openai.Config{Conn: nc, Model: info, Tokenizer: tok, ModelName: modelName, Log: testkit.Logger(t)}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := openai.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL, got
}

type apiErr struct {
	Error struct {
		Message string `json:"message"`
		Param   string `json:"param"`
		Code    string `json:"code"`
	} `json:"error"`
}

// TestImageRefusals: every way an image is refused, with its status, the
// part it names and a message that says why.
func TestImageRefusals(t *testing.T) {
	imgSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write(pngImage(t, 30, 20))
	}))
	defer imgSrv.Close()
	goodPNG := pngImage(t, 56, 40)
	good := dataURL("image/png", goodPNG)
	url, submitted := frontDoor(t, true, func(c *openai.Config) {
		c.Images = images.Limits{PerRequest: 3, Bytes: 64 << 10, TotalBytes: 100 << 10}
	})
	fetching, _ := frontDoor(t, true, func(c *openai.Config) { c.ImageFetch = &images.FetchConfig{} })
	allowed, fetched := frontDoor(t, true, func(c *openai.Config) {
		cfg := images.FetchConfig{Allow: []string{"127.0.0.1"}}.WithPermitted(netip.MustParsePrefix("127.0.0.0/8"))
		c.ImageFetch = &cfg
	})
	textOnly, _ := frontDoor(t, false, nil)
	smallPayload, _ := frontDoorOn(t, natstest.Start(t, natstest.Config{Extra: "max_payload: 65536\n"}), true, nil)
	noise := noisePNG(t, 200, 200) // about 120 KiB: no PNG compresses noise
	junk := bytes.Repeat([]byte("junk"), 15<<10)
	truncated := pngImage(t, 64, 64)
	truncated = truncated[:len(truncated)-40]
	param := "messages[0].content[1].image_url"
	for _, tc := range []struct {
		name   string
		url    string
		body   map[string]any
		status int
		code   string
		param  string
		want   string
	}{
		{"accepted", url, imageChat("what is it?", good), 400, "invalid_value", "", "stand-in coordinator saw the job"},
		{"garbage", url, imageChat("x", "data:image/png;base64,"+base64.StdEncoding.EncodeToString([]byte("not a picture at all"))), 400, "invalid_value", param, "unrecognised image format"},
		{"bad base64", url, imageChat("x", "data:image/png;base64,@@@@"), 400, "invalid_value", param, "base64 is malformed"},
		{"wrong media type", url, imageChat("x", dataURL("image/svg+xml", []byte("<svg/>"))), 400, "invalid_value", param, `media type is "image/svg+xml"`},
		{"mislabelled", url, imageChat("x", strings.Replace(good, "image/png", "image/webp", 1)), 400, "invalid_value", param, "says image/webp, but the data is a PNG image"},
		{"truncated", url, imageChat("x", dataURL("image/png", truncated)), 400, "invalid_value", param, "cannot be decoded"},
		{"too many", url, imageChat("x", good, good, good, good), 413, "request_too_large", "messages", "4 images, at most 3 allowed"},
		{"too large", url, imageChat("x", dataURL("image/png", bytes.Repeat([]byte{0x89}, 70<<10))), 413, "request_too_large", param, "at most 65536 allowed"},
		{"too large together", url, imageChat("x", dataURL("image/png", junk), dataURL("image/png", junk)), 413, "request_too_large", "messages", "122880 bytes together, at most 102400 allowed"},
		{"bomb header", url, imageChat("x", dataURL("image/png", pngDeclaring(20000, 20000))), 413, "request_too_large", param, "20000x20000 = 400000000 pixels"},
		{"100k x 100k header", url, imageChat("x", dataURL("image/png", pngDeclaring(100000, 100000))), 413, "request_too_large", param, "pixels, at most"},
		{"detail", url, map[string]any{"model": modelName, "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": good, "detail": "ultra"}}}}}}, 400, "invalid_value", "messages[0].content[0].image_url", `detail "ultra"`},
		{"placeholder in text", url, imageChat("see <|kimi_image_placeholder|>", good), 400, "invalid_value", "messages", "reads as an image"},
		{"audio part", url, map[string]any{"model": modelName, "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_audio", "input_audio": map[string]any{}}}}}}, 400, "invalid_value", "messages[0].content", `type "input_audio"`},
		{"fetch disabled", url, imageChat("x", imgSrv.URL+"/a.png"), 400, "invalid_value", param, "not fetched here"},
		{"private address", fetching, imageChat("x", imgSrv.URL+"/a.png"), 400, "invalid_value", param, "127.0.0.1 is not a public address"},
		{"private name", fetching, imageChat("x", strings.Replace(imgSrv.URL, "127.0.0.1", "localhost", 1)+"/a.png"), 400, "invalid_value", param, "is not a public address"},
		{"metadata address", fetching, imageChat("x", "http://169.254.169.254/latest/meta-data"), 400, "invalid_value", param, "169.254.169.254 is not a public address"},
		{"allow-listed", allowed, imageChat("x", imgSrv.URL+"/a.png"), 400, "invalid_value", "", "stand-in coordinator saw the job"},
		{"off the allow list", allowed, imageChat("x", strings.Replace(imgSrv.URL, "127.0.0.1", "localhost", 1)+"/a.png"), 400, "invalid_value", param, `host "localhost" is not in http.images.fetch_allow`},
		{"over max_payload", smallPayload, imageChat("x", dataURL("image/png", noise)), 413, "request_too_large", "messages", "max_payload, 65536 bytes"},
		{"no vision tower", textOnly, imageChat("x", good), 400, "invalid_value", param, "has no vision tower"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, tc.url+"/v1/chat/completions", "", tc.body)
			var e apiErr
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("%d %+v\nwant %d %s param %q mentioning %q", resp.StatusCode, e.Error, tc.status, tc.code, tc.param, tc.want)
			}
		})
	}
	// What the accepted requests submitted: the image as sent, and its
	// marker with one pad per feature row (56x40 pads to 56x56: 2x2 rows).
	checkSubmitted(t, submitted, goodPNG, "image 56x40", 4)
	checkSubmitted(t, fetched, pngImage(t, 30, 20), "image 30x20", 2) // 56x28: 2x1 rows
}

func checkSubmitted(t *testing.T, got <-chan cp.SubmitRequest, img []byte, label string, rows int) {
	t.Helper()
	var req cp.SubmitRequest
	select {
	case req = <-got:
	default:
		t.Fatal("nothing was submitted")
	}
	if len(req.Images) != 1 || !bytes.Equal(req.Images[0], img) {
		t.Fatalf("submitted %d images, want the one sent", len(req.Images))
	}
	tok := loadDemoTokenizer(t)
	pad, _ := tok.SpecialID(tokenizer.MediaPad)
	ids := make([]int, len(req.TokenIDs))
	for i, id := range req.TokenIDs {
		ids[i] = int(id)
	}
	first, n := slices.Index(ids, pad), 0
	for _, id := range ids {
		if id == pad {
			n++
		}
	}
	if first < 0 || n != rows || slices.Index(ids[first:], pad) != 0 || (n > 1 && ids[first+n-1] != pad) {
		t.Fatalf("%d pad ids from %d, want one run of %d", n, first, rows)
	}
	text, _ := tok.DecodeString(ids[:first])
	if !strings.HasSuffix(text, tokenizer.MediaBegin+label+tokenizer.MediaContent) {
		t.Errorf("prompt before the pads ends %q, want the marker %q", text[max(0, len(text)-60):], label)
	}
}

func loadDemoTokenizer(t *testing.T) *tokenizer.Tokenizer {
	tok, err := tokenizer.Load(testmodel.Dir(t, "demo", 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
