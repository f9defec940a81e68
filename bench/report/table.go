package report

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Table is rows of cells under a header.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
	// Notes are printed under the table.
	Notes []string
}

// Add appends a row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// Addf appends a row of values formatted with %v, or with the verb given
// for that column in formats when it has one.
func (t *Table) Addf(formats []string, values ...any) {
	row := make([]string, len(values))
	for i, v := range values {
		f := "%v"
		if i < len(formats) && formats[i] != "" {
			f = formats[i]
		}
		row[i] = fmt.Sprintf(f, v)
	}
	t.Add(row...)
}

func (t *Table) widths() []int {
	n := len(t.Header)
	for _, r := range t.Rows {
		n = max(n, len(r))
	}
	w := make([]int, n)
	for _, r := range append([][]string{t.Header}, t.Rows...) {
		for i, c := range r {
			w[i] = max(w[i], utf8.RuneCountInString(c))
		}
	}
	return w
}

// numericCols tells, per column, whether every non-empty cell of the rows
// reads as a number: such columns are right-aligned, header included.
func (t *Table) numericCols(n int) []bool {
	out := make([]bool, n)
	for i := range out {
		seen := false
		out[i] = true
		for _, r := range t.Rows {
			if i < len(r) && strings.TrimSpace(r[i]) != "" {
				seen = true
				out[i] = out[i] && numeric(r[i])
			}
		}
		out[i] = out[i] && seen
	}
	return out
}

// numeric reports whether a cell reads as a number (right-aligned).
func numeric(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" {
		return false
	}
	c := s[0]
	return c >= '0' && c <= '9' || (c == '-' || c == '+' || c == '.') && len(s) > 1 && s[1] >= '0' && s[1] <= '9'
}

// Write prints the table with columns aligned (numbers to the right).
func (t *Table) Write(w io.Writer) error {
	var b strings.Builder
	if t.Title != "" {
		b.WriteString(t.Title + "\n")
	}
	ws := t.widths()
	right := t.numericCols(len(ws))
	line := func(r []string) {
		for i := range ws {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := strings.Repeat(" ", ws[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if right[i] {
				b.WriteString(pad + c)
			} else if i < len(ws)-1 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(c)
			}
		}
		b.WriteString("\n")
	}
	if len(t.Header) > 0 {
		line(t.Header)
		sep := make([]string, len(ws))
		for i, n := range ws {
			sep[i] = strings.Repeat("-", n)
		}
		line(sep)
	}
	for _, r := range t.Rows {
		line(r)
	}
	for _, n := range t.Notes {
		b.WriteString(n + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Markdown writes the table as a GitHub-flavoured Markdown table.
func (t *Table) Markdown(w io.Writer) error {
	var b strings.Builder
	if t.Title != "" {
		b.WriteString("**" + mdEscape(t.Title) + "**\n\n")
	}
	ws := t.widths()
	right := t.numericCols(len(ws))
	row := func(r []string, header bool) {
		b.WriteString("|")
		for i := range ws {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			b.WriteString(" " + mdEscape(c) + " |")
		}
		b.WriteString("\n")
		if header {
			b.WriteString("|")
			for i := range ws {
				if right[i] {
					b.WriteString("---:|")
				} else {
					b.WriteString("---|")
				}
			}
			b.WriteString("\n")
		}
	}
	row(t.Header, true)
	for _, r := range t.Rows {
		row(r, false)
	}
	for _, n := range t.Notes {
		b.WriteString("\n" + mdEscape(n) + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mdEscape keeps a cell on one line and its pipes literal.
func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
