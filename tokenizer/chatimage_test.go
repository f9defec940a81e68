package tokenizer

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// imageChat is a user turn of text, an image, text and a second image, as
// an OpenAI client sends it.
const imageChat = `{"reasoning_effort": "none", "messages": [
	{"role": "system", "content": "Describe images."},
	{"role": "user", "content": [
		{"type": "text", "text": "Compare "},
		{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
		{"type": "text", "text": " with"},
		{"type": "image", "image": "ignored"}
	]}]}`

// TestRenderChatImages checks the segments of image parts against what
// the released renderer writes, checked by hand against encoding_k3.py
// (build_chat_segments with image_prompts from the processor's
// make_image_prompt): each image part is its marker, one segment with
// special tokens allowed, in the part's place; the text parts around it
// are their own segments, joined with nothing.
func TestRenderChatImages(t *testing.T) {
	var c Chat
	if err := json.Unmarshal([]byte(imageChat), &c); err != nil {
		t.Fatal(err)
	}
	c.Images = []ChatImage{{Width: 640, Height: 480, Rows: 400}, {Width: 3, Height: 5000, Rows: 36}}
	segs, err := RenderChat(&c)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, s := range segs {
		if s.Special {
			b.WriteString("«" + s.Text + "»")
		} else {
			b.WriteString(s.Text)
		}
	}
	want := `«<|open|>»message role="system"«<|sep|>»Describe images.«<|close|>»message«<|sep|>»«<|end_of_msg|>»` +
		`«<|open|>»message role="user"«<|sep|>»Compare ` +
		`«<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_end|>»` +
		` with` +
		`«<|media_begin|>image 3x5000<|media_content|><|media_pad|><|media_end|>»` +
		`«<|close|>»message«<|sep|>»«<|end_of_msg|>»` +
		`«<|open|>»message role="assistant"«<|sep|>»«<|open|>»response«<|sep|>»`
	if got := b.String(); got != want {
		t.Errorf("rendered\n%s\nwant\n%s", got, want)
	}
	var rows []int
	for _, s := range segs {
		if s.Rows > 0 {
			rows = append(rows, s.Rows)
		}
	}
	if !slices.Equal(rows, []int{400, 36}) {
		t.Errorf("marker rows %v, want [400 36]", rows)
	}

	// Without sizes, image parts render the released placeholder.
	c.Images = nil
	segs, err = RenderChat(&c)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range segs {
		if s.Special && s.Text == ImagePlaceholder {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d placeholders without image sizes, want 2", n)
	}
}

// TestEncodeChatImages checks that each image's one pad becomes Rows pad
// ids, and that the ids around it are the marker's.
func TestEncodeChatImages(t *testing.T) {
	tok := testTokenizer(t, "k3")
	var c Chat
	if err := json.Unmarshal([]byte(imageChat), &c); err != nil {
		t.Fatal(err)
	}
	c.Images = []ChatImage{{Width: 640, Height: 480, Rows: 400}, {Width: 3, Height: 5000, Rows: 36}}
	ids, err := tok.EncodeChat(&c)
	if err != nil {
		t.Fatal(err)
	}
	pad, _ := tok.SpecialID(MediaPad)
	begin, _ := tok.SpecialID(MediaBegin)
	content, _ := tok.SpecialID(MediaContent)
	end, _ := tok.SpecialID(MediaEnd)
	if pad != 163605 || begin != 163602 || content != 163603 || end != 163604 {
		t.Fatalf("media ids %d %d %d %d, want 163602..163605", begin, content, end, pad)
	}
	var runs []int
	for i := 0; i < len(ids); {
		if ids[i] != pad {
			i++
			continue
		}
		j := i
		for j < len(ids) && ids[j] == pad {
			j++
		}
		runs = append(runs, j-i)
		if ids[i-1] != content || ids[j] != end {
			t.Errorf("pad run at %d is not between <|media_content|> and <|media_end|>", i)
		}
		i = j
	}
	if !slices.Equal(runs, []int{400, 36}) {
		t.Errorf("pad runs %v, want [400 36]", runs)
	}
	// The label between <|media_begin|> and <|media_content|> is ordinary
	// text.
	first := slices.Index(ids, begin)
	label := ids[first+1 : first+1+slices.Index(ids[first+1:], content)]
	if got, _ := tok.DecodeString(label); got != "image 640x480" {
		t.Errorf("marker label %q, want %q", got, "image 640x480")
	}
	c.Images = nil
	plain, err := tok.EncodeChat(&c)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(plain, pad) {
		t.Error("the placeholder form holds pad ids")
	}
}

func TestRenderChatImageErrors(t *testing.T) {
	im := ChatImage{Width: 28, Height: 28, Rows: 1}
	for _, tc := range []struct {
		name   string
		chat   string
		images []ChatImage
		want   string
	}{
		{"more parts than images", imageChat, []ChatImage{im}, "content[3]: image part #2 has no image (1 given)"},
		{"more images than parts", imageChat, []ChatImage{im, im, im}, "3 images for 2 image parts"},
		{"no rows", imageChat, []ChatImage{im, {Width: 28, Height: 28}}, "image #2 is 28x28 with 0 feature rows"},
		{"placeholder in text", `{"messages": [{"role": "user", "content": "a <|kimi_image_placeholder|> b"}]}`, []ChatImage{}, "holds <|kimi_image_placeholder|>"},
		{"placeholder in a text part", `{"messages": [{"role": "user", "content": [{"type": "text", "text": "<|kimi_image_placeholder|>"}, {"type": "image_url"}]}]}`, []ChatImage{im}, "content[0]: holds"},
		{"placeholder in reasoning", `{"messages": [{"role": "assistant", "content": "x", "reasoning_content": "<|kimi_image_placeholder|>"}]}`, []ChatImage{}, "reasoning_content: holds"},
		{"placeholder in an argument", `{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{\"a\": \"<|kimi_image_placeholder|>\"}"}}]}]}`, []ChatImage{}, `arguments["a"]: holds`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Chat
			if err := json.Unmarshal([]byte(tc.chat), &c); err != nil {
				t.Fatal(err)
			}
			c.Images = tc.images
			_, err := RenderChat(&c)
			if err == nil || !errors.Is(err, ErrChat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrChat mentioning %q", err, tc.want)
			}
			// Without images, the released renderer keeps such text as text.
			if strings.Contains(tc.name, "placeholder") {
				c.Images = nil
				if _, err := RenderChat(&c); err != nil {
					t.Errorf("without images: %v", err)
				}
			}
		})
	}
}
