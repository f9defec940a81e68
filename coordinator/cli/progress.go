package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
)

// progressView is what `submit` shows of a job while people wait for its
// first token: the step it is at (queued, waiting for a weight pass,
// layers prefilled, transfer) and for how long. It is pure: events and
// clock readings in, text out; the terminal is progressLine's.
type progressView struct {
	start  time.Time
	route  *cp.RouteDecision
	step   string // what the job is doing now
	since  time.Time
	jobID  string
	gotTok bool
}

// event takes a job event and returns the lines to keep on the screen
// (the queueing and the route); the step changes as the event says.
func (p *progressView) event(ev cp.JobEvent, now time.Time) (keep []string) {
	p.jobID = ev.JobID
	if ev.Route != nil {
		p.route = ev.Route
	}
	step := p.step
	switch ev.State {
	case cp.StateQueued:
		keep = append(keep, fmt.Sprintf("job %s queued: %s", ev.JobID, ev.Detail))
		step = "queued"
	case cp.StateRouted:
		keep = append(keep, "routed "+client.Route(ev.Route))
		if ev.Route != nil && ev.Route.Reason != "" {
			keep = append(keep, "  "+ev.Route.Reason)
		}
		step = "waiting for the decode group"
		if r := p.route; r != nil && r.Target == cp.TargetRemote {
			step = "waiting for a weight pass on " + r.PrefillWorker
		}
	case cp.StatePrefilling:
		step = "prefilling" + p.where() + layers(ev.Progress, "")
	case cp.StateTransferring:
		step = "transfer to decode group" + p.group() + layers(ev.Progress, " committed")
	case cp.StateDecoding:
		step = "waiting for the first token"
	}
	if step != p.step {
		p.step, p.since = step, now
	}
	return keep
}

func (p *progressView) where() string {
	switch r := p.route; {
	case r == nil:
		return ""
	case r.Target == cp.TargetRemote:
		return " on " + r.PrefillWorker
	}
	return " on decode group" + p.group()
}

func (p *progressView) group() string {
	if p.route == nil || p.route.DecodeGroup == "" {
		return ""
	}
	return " " + p.route.DecodeGroup
}

func layers(lp *cp.LayerProgress, what string) string {
	if lp == nil || lp.Total <= 0 {
		return ""
	}
	return fmt.Sprintf(": layers %d/%d%s", lp.Done, lp.Total, what)
}

// status is the line shown while the job has no token yet: the time since
// submission and the step (with its own time when it has lasted a while).
func (p *progressView) status(now time.Time) string {
	if p.step == "" {
		return ""
	}
	s := fmt.Sprintf("%7s  %s", seconds(now.Sub(p.start)), p.step)
	if d := now.Sub(p.since); d >= time.Second && p.since.After(p.start) {
		s += fmt.Sprintf(" (%s)", seconds(d))
	}
	return s
}

// firstToken is the line kept when the first token arrives.
func (p *progressView) firstToken(now time.Time) string {
	p.gotTok = true
	return fmt.Sprintf("first token after %s", client.Duration(now.Sub(p.start)))
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// progressLine draws a progressView on a terminal: kept lines scroll up,
// the status is one line rewritten in place (carriage return and spaces,
// no escape sequences, so any terminal shows it) and refreshed on a
// ticker, so the time moves while nothing happens (a weight pass can be
// half a minute away). It stops at the first token, before the text
// streams on stdout.
type progressLine struct {
	mu    sync.Mutex
	w     io.Writer
	view  progressView
	shown int // runes of the status on screen
	stop  chan struct{}
	done  bool
	wg    sync.WaitGroup
	once  sync.Once
}

// statusWidth bounds the status line, so that it never wraps on an 80
// column terminal (a wrapped line cannot be rewritten in place).
const statusWidth = 79

func newProgressLine(w io.Writer, start time.Time) *progressLine {
	p := &progressLine{w: w, view: progressView{start: start}, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.tick()
	return p
}

func (p *progressLine) tick() {
	defer p.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.mu.Lock()
			if !p.done {
				p.draw(p.view.status(now))
			}
			p.mu.Unlock()
		}
	}
}

// draw rewrites the status line; the caller holds mu.
func (p *progressLine) draw(s string) {
	if n := utf8.RuneCountInString(s); n > statusWidth {
		s = string([]rune(s)[:statusWidth-1]) + "…"
	}
	n := utf8.RuneCountInString(s)
	fmt.Fprintf(p.w, "\r%s%s", s, strings.Repeat(" ", max(p.shown-n, 0)))
	if n < p.shown {
		fmt.Fprint(p.w, "\r"+s)
	}
	p.shown = n
}

// keep clears the status and prints lines that stay; the caller holds mu.
func (p *progressLine) keep(lines ...string) {
	if p.shown > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.shown))
		p.shown = 0
	}
	for _, l := range lines {
		fmt.Fprintln(p.w, l)
	}
}

func (p *progressLine) event(ev cp.JobEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	now := time.Now()
	if keep := p.view.event(ev, now); len(keep) > 0 {
		p.keep(keep...)
	}
	if ev.State.Final() {
		p.finish(nil)
		return
	}
	p.draw(p.view.status(now))
}

// token marks the first token: the status goes, a line says when it came.
func (p *progressLine) token() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.finish([]string{p.view.firstToken(time.Now())})
	}
}

// finish stops drawing; the caller holds mu.
func (p *progressLine) finish(lines []string) {
	p.keep(lines...)
	p.done = true
}

// Close stops the ticker and clears the status line; it may be called
// again.
func (p *progressLine) Close() {
	p.once.Do(func() {
		p.mu.Lock()
		if !p.done {
			p.finish(nil)
		}
		p.mu.Unlock()
		close(p.stop)
		p.wg.Wait()
	})
}

// isTerminal reports whether w is a terminal: progress is drawn only there.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && terminal(f.Fd())
}
