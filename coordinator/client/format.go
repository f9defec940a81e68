package client

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// Route describes a routing decision in one line.
func Route(r *cp.RouteDecision) string {
	if r == nil {
		return "not routed"
	}
	where := "decode group " + r.DecodeGroup + " prefills it itself"
	if r.CachedTokens > 0 {
		where += fmt.Sprintf(" (it holds the first %d tokens in its prefix cache)", r.CachedTokens)
	}
	if r.Target == cp.TargetRemote {
		where = "prefill worker " + r.PrefillWorker + " prefills it, decode group " + r.DecodeGroup + " decodes"
	}
	return fmt.Sprintf("%s (policy %s): %s; predicted time to first token: local %s, remote %s",
		r.Target, r.Policy, where, predicted(r.PredictedLocal), predicted(r.PredictedRemote))
}

func predicted(d time.Duration) string {
	if d <= 0 {
		return "unknown"
	}
	return Duration(d)
}

// Timing describes where a job's time went, one part per line.
func Timing(t *cp.Timing, target cp.Target) string {
	if t == nil {
		return "no timing"
	}
	var b strings.Builder
	row := func(name string, d time.Duration, note string) {
		fmt.Fprintf(&b, "  %-24s %10s  %s\n", name, Duration(d), note)
	}
	row("queue", t.Queue, "submitted -> routed")
	if target == cp.TargetRemote {
		row("pass wait", t.PassWait, "routed -> its weight pass started")
		row("prefill (remote)", t.Prefill, fmt.Sprintf("%d prompt tokens on the prefill worker", max(t.PromptTokens-1, 0)))
		row("transfer tail", t.TransferTail, "last layer computed -> every rank committed its state")
	} else {
		note := fmt.Sprintf("%d prompt tokens on the decode group, and its first step", t.PromptTokens)
		if t.CachedTokens > 0 {
			note = fmt.Sprintf("%d prompt tokens on the decode group, and its first step (%d of them from its prefix cache on %s)",
				t.PromptTokens-t.CachedTokens, t.CachedTokens, t.CachedOn)
		}
		row("prefill (local)", t.Prefill, note)
	}
	row("time to first token", t.FirstToken, "submitted -> first token")
	rate := ""
	if t.DecodeTokensPerSec > 0 {
		rate = fmt.Sprintf("%.1f tokens/s", t.DecodeTokensPerSec)
	}
	row("decode", t.Decode, fmt.Sprintf("%d tokens after the first; %s", max(t.OutputTokens-1, 0), rate))
	row("total", t.Total, "")
	return b.String()
}

// Duration prints a duration with about three significant digits.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(10 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Printable makes generated text safe for a terminal: control characters
// (a synthetic model's random tokens are full of them) become '·'.
func Printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || unicode.IsPrint(r) {
			return r
		}
		return '·'
	}, s)
}
