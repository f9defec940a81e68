package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// streamAll pushes ids one by one and returns the pieces handed out, the
// last being Flush's.
func streamAll(t *testing.T, d *StreamDecoder, ids []int) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		s, err := d.Push(id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return append(out, d.Flush())
}

// byteTokens merges the raw bytes of s, which may begin or end inside a
// character, into tokens.
func byteTokens(tok *Tokenizer, s string) []int {
	if s == "" {
		return nil
	}
	e := newEncoder(tok)
	e.piece(s)
	return e.out
}

func TestStreamDecoderEverySplit(t *testing.T) {
	tok := testTokenizer(t, "k3")
	texts := []string{
		"héllo 漢字々 👩‍💻 ｶﾀ",
		"\xe2\x82 x\xf0\x9f\x98 \xff\xe4\xb8",
	}
	for _, text := range texts {
		want := ToValidUTF8([]byte(text))
		// Token boundaries at every pair of byte offsets, inside
		// characters or not.
		for k1 := 0; k1 <= len(text); k1++ {
			for k2 := k1; k2 <= len(text); k2++ {
				var ids []int
				ids = append(ids, byteTokens(tok, text[:k1])...)
				ids = append(ids, byteTokens(tok, text[k1:k2])...)
				ids = append(ids, byteTokens(tok, text[k2:])...)
				if whole, err := tok.DecodeString(ids); err != nil || whole != want {
					t.Fatalf("DecodeString = %q, %v; want %q", whole, err, want)
				}
				d := NewStreamDecoder(tok)
				var got strings.Builder
				for _, s := range streamAll(t, d, ids) {
					if !utf8.ValidString(s) {
						t.Fatalf("stream handed out invalid UTF-8 %q", s)
					}
					got.WriteString(s)
					if d.Pending() > 3 {
						t.Fatalf("holding back %d bytes", d.Pending())
					}
				}
				if got.String() != want {
					t.Fatalf("splits at %d, %d: streamed %q, want %q", k1, k2, got.String(), want)
				}
			}
		}
	}
}

func TestStreamDecoderHoldsIncompleteTail(t *testing.T) {
	tok := testTokenizer(t, "small")
	d := NewStreamDecoder(tok)
	// 中 is E4 B8 AD: nothing comes out until its last byte.
	for i, b := range []byte("中") {
		s, err := d.Push(int(b))
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "中", false: ""}[i == 2]; s != want {
			t.Errorf("after byte %d: %q, want %q", i, s, want)
		}
	}
	// A truncated character at the end becomes U+FFFD on Flush, and the
	// decoder is ready for a new sequence.
	if _, err := d.Push(0xe4); err != nil {
		t.Fatal(err)
	}
	if got := d.Flush(); got != "\uFFFD" {
		t.Errorf("Flush = %q", got)
	}
	if d.Pending() != 0 {
		t.Errorf("Pending after Flush = %d", d.Pending())
	}
	// A bad id is an error and leaves the held bytes alone.
	if _, err := d.Push(0xe4); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Push(tok.VocabSize()); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Errorf("bad id: err = %v", err)
	}
	if s, _ := d.Push(0xb8); s != "" {
		t.Errorf("got %q before the character is complete", s)
	}
	if s, _ := d.Push(0xad); s != "中" {
		t.Errorf("got %q, want 中", s)
	}
}

func FuzzStreamDecoder(f *testing.F) {
	for _, s := range []string{"héllo 漢字", "\xe2\x82 x\xf0\x9f\x98", "\xff\xc0\xaf\xed\xa0\x80"} {
		f.Add(s, uint8(3))
	}
	tok := testTokenizer(f, "small")
	f.Fuzz(func(t *testing.T, s string, step uint8) {
		// Tokens of 1..step bytes each, cut anywhere, even inside a
		// character.
		n := int(step%8) + 1
		var ids []int
		for i := 0; i < len(s); i += n {
			ids = append(ids, byteTokens(tok, s[i:min(i+n, len(s))])...)
		}
		d := NewStreamDecoder(tok)
		var got strings.Builder
		for _, id := range ids {
			out, err := d.Push(id)
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(out) {
				t.Fatalf("invalid UTF-8 %q", out)
			}
			got.WriteString(out)
		}
		got.WriteString(d.Flush())
		if want := ToValidUTF8([]byte(s)); got.String() != want {
			t.Fatalf("streamed %q, want %q", got.String(), want)
		}
	})
}
