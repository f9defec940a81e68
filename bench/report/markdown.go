package report

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Doc is a Markdown report built section by section.
type Doc struct {
	b strings.Builder
}

// Heading adds a heading of the given level (1-6).
func (d *Doc) Heading(level int, text string) {
	level = min(max(level, 1), 6)
	d.b.WriteString(strings.Repeat("#", level) + " " + mdEscape(text) + "\n\n")
}

// Para adds a paragraph (Markdown allowed).
func (d *Doc) Para(format string, args ...any) {
	d.b.WriteString(strings.TrimSpace(fmt.Sprintf(format, args...)) + "\n\n")
}

// Bullets adds a list.
func (d *Doc) Bullets(items ...string) {
	for _, it := range items {
		d.b.WriteString("- " + it + "\n")
	}
	d.b.WriteString("\n")
}

// Table adds a table.
func (d *Doc) Table(t *Table) {
	t.Markdown(&d.b) // a strings.Builder does not fail
	d.b.WriteString("\n")
}

// Image links a chart, by a path relative to the report.
func (d *Doc) Image(alt, rel string) {
	d.b.WriteString("![" + mdEscape(alt) + "](" + filepath.ToSlash(rel) + ")\n\n")
}

// Code adds a fenced code block.
func (d *Doc) Code(lang, text string) {
	d.b.WriteString("```" + lang + "\n" + strings.TrimRight(text, "\n") + "\n```\n\n")
}

// String is the document so far.
func (d *Doc) String() string { return d.b.String() }

// WriteFile writes the document to path, creating its folder.
func (d *Doc) WriteFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(path, []byte(d.String()), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
