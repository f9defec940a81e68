package cli

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// submissionOf builds the request `submit ARGS...` sends.
func submissionOf(t *testing.T, args ...string) (cp.SubmitRequest, error) {
	t.Helper()
	cmd := submitCmd()
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	return submission(cmd, cmd.Flags().Args())
}

// TestSubmitImages: where --image files and a chat's data: URLs go.
func TestSubmitImages(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, w int) (string, []byte) {
		var b bytes.Buffer
		if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, 10))); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p, b.Bytes()
	}
	a, aBytes := file("a.png", 10)
	b, bBytes := file("b.png", 20)
	parts := func(m cp.ChatMessage) string {
		var s []string
		for _, p := range m.Parts {
			s = append(s, p.Type+":"+p.Text)
		}
		return strings.Join(s, " ")
	}

	// A plain prompt: one user message, the images first.
	req, err := submissionOf(t, "--image", a, "--image", b, "--system", "be brief", "what differs?")
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Messages) != 2 || req.Messages[0].Content != "be brief" || parts(req.Messages[1]) != "image: image: text:what differs?" ||
		req.Prompt != "" || len(req.Images) != 2 || !bytes.Equal(req.Images[0], aBytes) || !bytes.Equal(req.Images[1], bBytes) {
		t.Fatalf("plain prompt with images: %+v", req.Messages)
	}

	// A chat whose first user turn has a data: URL; --image goes first in
	// its last user turn, after the chat's own image.
	chat := map[string]any{"messages": []any{
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "look"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(bBytes)}}}},
		map[string]any{"role": "assistant", "content": "a square"},
		map[string]any{"role": "user", "content": "and this one?"}}}
	body, _ := json.Marshal(chat)
	chatFile := filepath.Join(dir, "chat.json")
	if err := os.WriteFile(chatFile, body, 0o600); err != nil {
		t.Fatal(err)
	}
	req, err = submissionOf(t, "--chat", chatFile, "--image", a)
	if err != nil {
		t.Fatal(err)
	}
	if parts(req.Messages[0]) != "text:look image:" || parts(req.Messages[2]) != "image: text:and this one?" ||
		len(req.Images) != 2 || !bytes.Equal(req.Images[0], bBytes) || !bytes.Equal(req.Images[1], aBytes) {
		t.Fatalf("chat with images: %+v, %d images", req.Messages, len(req.Images))
	}

	// Token ids: the images go along as they are.
	req, err = submissionOf(t, "--ids", "1,2,3", "--image", a)
	if err != nil || !slices.Equal(req.TokenIDs, []int32{1, 2, 3}) || len(req.Images) != 1 || len(req.Messages) != 0 {
		t.Fatalf("ids with an image: %+v, %v", req, err)
	}

	chat["messages"] = []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/a.png"}}}}}
	body, _ = json.Marshal(chat)
	if err := os.WriteFile(chatFile, body, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--image", filepath.Join(dir, "missing.png"), "hi"}, "--image: open"},
		{[]string{"--chat", chatFile}, "is not a data: URL"},
	} {
		if _, err := submissionOf(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
