package report

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTableAlignsColumnsAndNumbers(t *testing.T) {
	tb := &Table{Title: "TTFT", Header: []string{"policy", "p50", "note"}}
	tb.Add("local", "7.5", "short stays")
	tb.Addf([]string{"", "%.1f"}, "remote", 29.44, "pass floor")
	tb.Notes = []string{"seconds"}
	var b bytes.Buffer
	if err := tb.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "TTFT\n" +
		"policy   p50  note\n" +
		"------  ----  -----------\n" +
		"local    7.5  short stays\n" +
		"remote  29.4  pass floor\n" +
		"seconds\n"
	if b.String() != want {
		t.Fatalf("table\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	tb.Rows = append(tb.Rows, []string{"a|b", "1", "x\ny"})
	if err := tb.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, s := range []string{"| policy | p50 | note |", "|---|---:|---|", `| a\|b | 1 | x y |`} {
		if !strings.Contains(md, s) {
			t.Fatalf("markdown lacks %q:\n%s", s, md)
		}
	}
}

func TestJSONLineIsOneObjectOnOneLine(t *testing.T) {
	var b bytes.Buffer
	if err := JSONLine(&b, map[string]any{"policies": []string{"a\nb"}, "n": 1}); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
		t.Fatalf("not one line: %q", s)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil || v["n"] != 1.0 {
		t.Fatalf("decoded %v, %v", v, err)
	}
	if err := JSONLine(&b, []int{1}); err == nil {
		t.Fatal("a JSON array was accepted as the line")
	}
	if err := JSONLine(&b, map[string]any{"f": func() {}}); err == nil {
		t.Fatal("an unencodable value gave no error")
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	bd := img.Bounds()
	if bd.Dx() < 600 || bd.Dy() < 400 {
		t.Fatalf("%s is %v", path, bd)
	}
	// Not blank: more than one colour.
	first := img.At(0, 0)
	for y := bd.Min.Y; y < bd.Max.Y; y += 7 {
		for x := bd.Min.X; x < bd.Max.X; x += 7 {
			if img.At(x, y) != first {
				return
			}
		}
	}
	t.Fatalf("%s is blank", path)
}

func TestChartsRenderPNGs(t *testing.T) {
	dir := t.TempDir()
	lc := LineChart{Title: "TTFT", XLabel: "tokens", YLabel: "s", LogX: true, LogY: true, Series: []Series{
		{Name: "macs", X: []float64{1e3, 1e4, 1e5}, Y: []float64{6, 62, 890}},
		{Name: "gpu", X: []float64{0, 1e3, 1e4, 1e5}, Y: []float64{29, 29, 29.5, 112}}, // x=0 cannot be drawn on a log axis
	}}
	p := filepath.Join(dir, "sub", "ttft.png")
	if err := lc.SavePNG(p); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, p)
	lc.Scatter, lc.LogY = true, false
	p = filepath.Join(dir, "scatter.png")
	if err := lc.SavePNG(p); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, p)
	lc.Scatter, lc.LogY = false, true
	// One point on log axes: a range around it, not one reaching zero.
	one := LineChart{Title: "one", LogX: true, LogY: true, Series: []Series{{Name: "a", X: []float64{0.5}, Y: []float64{0.25}}}}
	p = filepath.Join(dir, "one.png")
	if err := one.SavePNG(p); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, p)
	sb := StackedBars{Title: "breakdown", YLabel: "s", Categories: []string{"1k", "300k"}, Parts: []Part{
		{Name: "queue", Values: []float64{0, 1}}, {Name: "prefill", Values: []float64{29, 500}}}}
	p = filepath.Join(dir, "bars.png")
	if err := sb.SavePNG(p); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, p)

	for _, c := range []struct {
		err  error
		want string
	}{
		{LineChart{Title: "x", LogY: true, Series: []Series{{Name: "z", X: []float64{1}, Y: []float64{0}}}}.SavePNG(filepath.Join(dir, "a.png")), "no point to draw"},
		{LineChart{Title: "x", Series: []Series{{Name: "z", X: []float64{1, 2}, Y: []float64{0}}}}.SavePNG(filepath.Join(dir, "b.png")), `series "z" has 2 x and 1 y`},
		{lc.SavePNG(filepath.Join(dir, "c.svg")), "want a .png name"},
		{StackedBars{Title: "s", Categories: []string{"a"}, Parts: []Part{{Name: "p", Values: []float64{-1}}}}.SavePNG(filepath.Join(dir, "d.png")), "cannot be stacked"},
		{StackedBars{Title: "s"}.SavePNG(filepath.Join(dir, "e.png")), "no bars"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v, want %q", c.err, c.want)
		}
	}
}

func TestMarkdownDoc(t *testing.T) {
	var d Doc
	d.Heading(1, "bench sim")
	d.Para("Ran %d jobs.", 3)
	d.Bullets("a", "b")
	d.Table(&Table{Header: []string{"k", "v"}, Rows: [][]string{{"x", "1"}}})
	d.Image("ttft", "ttft.png")
	d.Code("sh", "go run ./bench sim\n")
	p := filepath.Join(t.TempDir(), "r", "REPORT.md")
	if err := d.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	want := "# bench sim\n\nRan 3 jobs.\n\n- a\n- b\n\n| k | v |\n|---|---:|\n| x | 1 |\n\n![ttft](ttft.png)\n\n```sh\ngo run ./bench sim\n```\n\n"
	if string(b) != want {
		t.Fatalf("doc\n%q\nwant\n%q", b, want)
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Duration(0.045), "45 ms"}, {Duration(29.36), "29.4 s"}, {Duration(511.7), "8.5 min"}, {Duration(35160), "9.8 h"},
		{Bytes(512), "512 B"}, {Bytes(8_759_000_000), "8.8 GB"}, {Bytes(1_560_000_000_000), "1.6 TB"},
		{Tokens(300000), "300k"}, {Tokens(1_000_000), "1M"}, {Tokens(1500), "1500"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
