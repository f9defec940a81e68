package report

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Chart size in inches (PNG at the plot package's default 96 dpi).
const chartW, chartH = 9, 5.5

// Series is one line of a line chart.
type Series struct {
	Name string
	X, Y []float64
}

// LineChart is lines over a shared x axis, optionally logarithmic.
type LineChart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	// Scatter draws points only (for per-job values), not lines.
	Scatter bool
	Series  []Series
}

// SavePNG renders the chart to path. On a log axis, points at or below
// zero cannot be drawn and are left out; a chart left with no point is an
// error.
func (c LineChart) SavePNG(path string) error {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text, p.Y.Label.Text = c.XLabel, c.YLabel
	if c.LogX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if c.LogY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	points := 0
	for i, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("report: chart %q: series %q has %d x and %d y values", c.Title, s.Name, len(s.X), len(s.Y))
		}
		var xys plotter.XYs
		for k := range s.X {
			x, y := s.X[k], s.Y[k]
			if !finite(x) || !finite(y) || c.LogX && x <= 0 || c.LogY && y <= 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: x, Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		points += len(xys)
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return fmt.Errorf("report: chart %q: %w", c.Title, err)
		}
		sc.Color, sc.Shape = plotutil.Color(i), plotutil.Shape(i)
		if c.Scatter {
			p.Add(sc)
			p.Legend.Add(s.Name, sc)
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("report: chart %q: %w", c.Title, err)
		}
		l.Color, l.Dashes = plotutil.Color(i), plotutil.Dashes(i)
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
	}
	if points == 0 {
		return fmt.Errorf("report: chart %q has no point to draw", c.Title)
	}
	widen(&p.X, c.LogX)
	widen(&p.Y, c.LogY)
	p.Add(plotter.NewGrid())
	return save(p, path)
}

// widen gives an axis whose data is one value a range around it: the plot
// package would widen it by ±1, which on a log axis can reach zero (and its
// log ticks panic on that).
func widen(a *plot.Axis, log bool) {
	if a.Min != a.Max {
		return
	}
	if log {
		a.Min, a.Max = a.Min/2, a.Max*2
	} else {
		a.Min, a.Max = a.Min-1, a.Max+1
	}
}

// Part is one layer of a stacked bar chart: a value per category.
type Part struct {
	Name   string
	Values []float64
}

// StackedBars is one bar per category, each made of the parts stacked.
type StackedBars struct {
	Title, YLabel string
	Categories    []string
	Parts         []Part
}

// SavePNG renders the chart to path.
func (c StackedBars) SavePNG(path string) error {
	if len(c.Categories) == 0 || len(c.Parts) == 0 {
		return fmt.Errorf("report: chart %q has no bars", c.Title)
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.Y.Label.Text = c.YLabel
	w := vg.Points(math.Max(8, math.Min(40, 480/float64(len(c.Categories)))))
	var below *plotter.BarChart
	for i, part := range c.Parts {
		if len(part.Values) != len(c.Categories) {
			return fmt.Errorf("report: chart %q: part %q has %d values for %d bars", c.Title, part.Name, len(part.Values), len(c.Categories))
		}
		vs := make(plotter.Values, len(part.Values))
		for k, v := range part.Values {
			if !finite(v) || v < 0 {
				return fmt.Errorf("report: chart %q: part %q, bar %q: value %v cannot be stacked", c.Title, part.Name, c.Categories[k], v)
			}
			vs[k] = v
		}
		b, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return fmt.Errorf("report: chart %q: %w", c.Title, err)
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		p.Add(b)
		p.Legend.Add(part.Name, b)
	}
	p.Legend.Top = true
	p.NominalX(c.Categories...)
	if len(c.Categories) > 8 {
		p.X.Tick.Label.Rotation = math.Pi / 4
		p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = -1, -0.5
	}
	p.Add(plotter.NewGrid())
	return save(p, path)
}

func save(p *plot.Plot, path string) error {
	if filepath.Ext(path) != ".png" {
		return fmt.Errorf("report: chart file %s: want a .png name", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := p.Save(chartW*vg.Inch, chartH*vg.Inch, path); err != nil {
		return errors.Join(fmt.Errorf("report: writing chart %s", path), err)
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
