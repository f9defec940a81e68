package tokenizer

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestVocabAndSpecials(t *testing.T) {
	tok := testTokenizer(t, "k3")
	if tok.VocabSize() != 163840 || tok.NumRanks() != 163584 {
		t.Fatalf("VocabSize %d, NumRanks %d; want 163840, 163584", tok.VocabSize(), tok.NumRanks())
	}
	// The K3 ids of spec section 6.
	for name, id := range map[string]int{
		BOS: 163584, EOS: 163585, EndOfMsg: 163586, Open: 163587, Close: 163588, Sep: 163589,
		"[EOT]": 163593, MediaPad: 163605, "<osagent_mode>": 163649, UNK: 163838, PAD: 163839,
		"<|reserved_token_163592|>": 163592,
	} {
		if got, ok := tok.SpecialID(name); !ok || got != id {
			t.Errorf("SpecialID(%q) = %d, %v; want %d", name, got, ok, id)
		}
	}
	if _, ok := tok.SpecialID("hello"); ok {
		t.Error("SpecialID(hello) found a token")
	}
	if tok.EndOfMessageID() != 163586 || !tok.IsStop(163586) || tok.IsStop(163585) {
		t.Errorf("EndOfMessageID = %d", tok.EndOfMessageID())
	}
	if !tok.IsSpecial(163584) || tok.IsSpecial(163583) || tok.IsSpecial(163840) {
		t.Error("IsSpecial misplaces the special range")
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, name := range []string{"small", "k3"} {
		tok := testTokenizer(t, name)
		for _, s := range []string{"", "a", "Hello, world!", string(DefaultCorpus()), "<|open|>[BOS] stays text", strings.Repeat(" ", 30000) + "x"} {
			ids := tok.Encode(s)
			got, err := tok.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != s {
				t.Errorf("%s: decode(encode(%.40q)) = %.40q", name, s, got)
			}
			if open, _ := tok.SpecialID(Open); contains(ids, open) {
				t.Errorf("%s: Encode recognised a special token in ordinary text", name)
			}
		}
	}
}

func contains(ids []int, id int) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestEncodeWithSpecials(t *testing.T) {
	tok := testTokenizer(t, "small")
	open, _ := tok.SpecialID(Open)
	sep, _ := tok.SpecialID(Sep)
	bos, _ := tok.SpecialID(BOS)
	text := "[BOS]<|open|>hi<|sep|>"

	all, err := tok.EncodeWithSpecials(text)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]int{bos, open}, tok.Encode("hi")...), sep)
	if !reflect.DeepEqual(all, want) {
		t.Errorf("all specials: %v, want %v", all, want)
	}

	some, err := tok.EncodeWithSpecials(text, Open)
	if err != nil {
		t.Fatal(err)
	}
	want = append(append(tok.Encode("[BOS]"), open), tok.Encode("hi<|sep|>")...)
	if !reflect.DeepEqual(some, want) {
		t.Errorf("only <|open|>: %v, want %v", some, want)
	}
	if contains(tok.Encode(text), open) {
		t.Error("Encode recognised <|open|>")
	}

	if _, err := tok.EncodeWithSpecials(text, "<|nope|>"); err == nil || !strings.Contains(err.Error(), `"<|nope|>" is not a special token`) {
		t.Errorf("unknown special: err = %v", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	tok := testTokenizer(t, "small")
	for _, ids := range [][]int{{1, -1}, {1, 2, 2048}} {
		_, err := tok.Decode(ids)
		if err == nil || !strings.Contains(err.Error(), "outside the vocabulary [0, 2048)") ||
			!strings.Contains(err.Error(), "position") {
			t.Errorf("Decode(%v): err = %v", ids, err)
		}
	}
	b, err := tok.Decode([]int{tok.EndOfMessageID()})
	if err != nil || string(b) != EndOfMsg {
		t.Errorf("special decodes to %q, %v", b, err)
	}
}

func TestInvalidUTF8(t *testing.T) {
	// Maximal subparts, as in the WHATWG decoder: one U+FFFD each.
	tests := []struct{ in, want string }{
		{"a\xffb", "a\uFFFDb"},
		{"\xe2\x82", "\uFFFD"},                 // truncated 3-byte sequence: one subpart
		{"\xe2\x82x", "\uFFFDx"},               //
		{"\xf0\x9f\x98", "\uFFFD"},             // truncated 4-byte sequence
		{"\xc0\xaf", "\uFFFD\uFFFD"},           // C0 never starts a sequence
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED A0 is ill-formed at A0
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"\xe4\xb8\xad", "中"},
		{"\uFFFD", "\uFFFD"},
	}
	for _, tt := range tests {
		if got := ToValidUTF8([]byte(tt.in)); got != tt.want {
			t.Errorf("ToValidUTF8(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := toValidString(tt.in); got != tt.want {
			t.Errorf("toValidString(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	tok := testTokenizer(t, "small")
	in := "caf\xc3 \xe2\x82 ok"
	if got, want := tok.Encode(in), tok.Encode(ToValidUTF8([]byte(in))); !reflect.DeepEqual(got, want) {
		t.Errorf("Encode of invalid UTF-8 %v, of its replacement %v", got, want)
	}
}

func TestEncodeIsSafeForConcurrentUse(t *testing.T) {
	tok := testTokenizer(t, "small")
	text := string(DefaultCorpus())
	want := tok.Encode(text)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 5 {
				if got := tok.Encode(text); !reflect.DeepEqual(got, want) {
					errs <- errors.New("concurrent Encode differs")
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"Hello, world!", "漢字々〇 ｶﾀｶﾅ", "a  \r\n\r\n b", "I'M it's", "👩‍💻 ❤️", "\xff\xe2\x82 x"} {
		f.Add(s)
	}
	tok := testTokenizer(f, "small")
	big := testTokenizer(f, "k3")
	f.Fuzz(func(t *testing.T, s string) {
		want := s
		if !utf8.ValidString(s) {
			want = ToValidUTF8([]byte(s))
		}
		for _, tk := range []*Tokenizer{tok, big} {
			got, err := tk.DecodeString(tk.Encode(s))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("decode(encode(%q)) = %q", s, got)
			}
		}
	})
}
