// Package report renders benchmark results: aligned tables for the
// terminal, one JSON object on the last line of output (--json), PNG charts
// (gonum.org/v1/plot) and a Markdown report that shows the tables and links
// the charts. It knows nothing of what is measured.
package report
