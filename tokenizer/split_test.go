package tokenizer

import (
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode"
)

func TestSplitPieces(t *testing.T) {
	// Expected splits follow from the pattern's alternatives; the golden
	// split cases check many more against the reference engine.
	tests := []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"it's I'M we'Re DON'T", []string{"it's", " I'M", " we'Re", " DON'T"}},
		{"x'ſ", []string{"x'ſ"}},               // (?i) folds s to long s
		{"x'K", []string{"x", "'K"}},           // K is no contraction
		{"HTTPServer", []string{"HTTPServer"}}, // U* takes HTTPS, L+ erver
		{"camelCase", []string{"camel", "Case"}},
		{"12345", []string{"123", "45"}},
		{"你好世界abc", []string{"你好世界", "abc"}},
		{"々〇〡", []string{"々〇〡"}},           // Han Lm and Nl stay in the Han run
		{"1〇", []string{"1〇"}},             // 〇 is a number, after a digit
		{"a  b", []string{"a", " ", " b"}}, // \s+(?!\S) leaves the last space
		{"a \n\n b", []string{"a", " \n\n", " b"}},
		{"a\r\n\r\n", []string{"a", "\r\n\r\n"}},
		{"x   ", []string{"x", "   "}},         // at the end the lookahead passes
		{" !!\n\nx", []string{" !!\n\n", "x"}}, // punctuation takes trailing newlines
		{"\u0301abc", []string{"\u0301abc"}},   // a mark opens a word
		{"!\u0301", []string{"!\u0301"}},
		{"ǅungla", []string{"ǅungla"}},
		{"\x1c\x1d", []string{"\x1c\x1d"}}, // not \s: punctuation
		{"", nil},
	}
	for _, tt := range tests {
		var got []string
		splitPieces(tt.in, func(p string) { got = append(got, p) })
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("split %q = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCuts(t *testing.T) {
	c := cutter{chunkChars: 5, runChars: 3}
	tests := []struct {
		in   string
		want []string
	}{
		{"abcdefgh", []string{"abc", "de", "fgh"}},
		{"ab  cd", []string{"ab  c", "d"}},
		{"a     ", []string{"a   ", " ", " "}},                   // run cut after 3 characters, chunk after 5
		{"ééééé", []string{"ééé", "éé"}},                         // characters, not bytes
		{"a\x1c\x1c\x1c\x1c", []string{"a\x1c\x1c\x1c", "\x1c"}}, // \x1c is str.isspace
		{"", nil},
	}
	for _, tt := range tests {
		var got []string
		c.cut(tt.in, func(p string) { got = append(got, p) })
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("cut %q = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestKimiCutLimits(t *testing.T) {
	// 25,001 spaces after a letter: the run is cut after 25,000 spaces.
	got := 0
	var lens []int
	kimiCuts.cut("a"+strings.Repeat(" ", 25001), func(p string) { got++; lens = append(lens, len(p)) })
	if !reflect.DeepEqual(lens, []int{25001, 1}) {
		t.Errorf("run cut: piece lengths %v, want [25001 1]", lens)
	}
	// 400,001 characters of alternating classes: one chunk cut.
	lens = nil
	kimiCuts.cut(strings.Repeat("é ", 200000)+"x", func(p string) { lens = append(lens, len(p)) })
	if !reflect.DeepEqual(lens, []int{600000, 1}) {
		t.Errorf("chunk cut: piece lengths %v, want [600000 1]", lens)
	}
}

func TestPySpace(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
		if pySpace(r) != want {
			t.Fatalf("pySpace(%U) = %v, want %v", r, pySpace(r), want)
		}
	}
}

var dumpBaseClasses = flag.String("dump-base-classes", "", "write the class of every code point from Go's tables alone to `file` (for testdata/golden/unicode.sh)")

func TestClassTable(t *testing.T) {
	base := make([]byte, unicode.MaxRune+1)
	for r := rune(0); r <= unicode.MaxRune; r++ {
		base[r] = byte(slowClassOf(r))
		want := slowClassOf(r)
		if u, ok := updatedClass(r); ok {
			if u == want {
				t.Fatalf("unicode_update.go changes nothing for %U: rerun testdata/golden/unicode.sh", r)
			}
			want = u
		}
		if got := classOf(r); got != want {
			t.Fatalf("classOf(%U) = %b, want %b", r, got, want)
		}
	}
	for i := 1; i < len(unicodeUpdates); i++ {
		if unicodeUpdates[i].lo <= unicodeUpdates[i-1].hi {
			t.Fatalf("unicodeUpdates not sorted at %d", i)
		}
	}
	if *dumpBaseClasses != "" {
		if err := os.WriteFile(*dumpBaseClasses, base, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range []string{"Hello, world!", "a  b\r\n\r\n c", "漢字々〇1", "it's\u0301 ǅ", "\xff\xe2\x82"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = toValidString(s)
		var sb strings.Builder
		splitPieces(s, func(p string) {
			if p == "" {
				t.Fatalf("empty piece in %q", s)
			}
			sb.WriteString(p)
		})
		if sb.String() != s {
			t.Fatalf("pieces of %q join to %q", s, sb.String())
		}
	})
}
