package main

import (
	"fmt"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/internal/prefixkey"
)

// simAgent is one setup's agent turn: a session's next prompt (its history
// plus new tokens) on an idle cluster, without the prefix caches and with
// them holding the history, priced by the router's cost model (the one the
// simulator times passes by) at the setup's rates.
type simAgent struct {
	NoCacheS     float64 `json:"ttft_s_no_cache"`
	CacheS       float64 `json:"ttft_s_cache"`
	TargetNo     string  `json:"target_no_cache"`
	TargetCache  string  `json:"target_cache"`
	CachedTokens int     `json:"cached_tokens"`
}

// agentTurn prices a turn of history+fresh tokens on setup s: without
// caches, and with the decode group's cache and (with a prefill box) the
// prefill worker's store both holding the history's last multiple of 64,
// as they do after a turn on either path. The router's choice each way.
func agentTurn(s sim.Setup, history, fresh int) simAgent {
	m := s.Model.Cost
	r := sim.SeedRates(s, 8192)
	n := history + fresh
	held := history / prefixkey.Block * prefixkey.Block
	none := router.Load{PrefillUp: s.Prefill != nil, LocalChunk: s.Decode.PrefillChunk}
	cached := none
	cached.LocalCached = held
	if s.Prefill != nil {
		cached.RemoteSplit = (n - 1) / prefixkey.Block * prefixkey.Block
		cached.RemoteCached = held
		cached.RemoteAppend = min(held, cached.RemoteSplit-prefixkey.Block)
	}
	a := router.Route(router.Auto, m, r, none, n)
	b := router.Route(router.Auto, m, r, cached, n)
	ttft := func(d router.Decision) float64 {
		if d.Target == router.TargetRemote {
			return d.Remote.Total.Seconds()
		}
		return d.Local.Total.Seconds()
	}
	return simAgent{NoCacheS: round3(ttft(a)), CacheS: round3(ttft(b)), TargetNo: string(a.Target), TargetCache: string(b.Target), CachedTokens: held}
}

// agentTable shows the agent turn of every setup.
func agentTable(model string, history, fresh int, order []string, agent map[string]simAgent) *report.Table {
	t := &report.Table{Title: fmt.Sprintf("Agent turn: %s-token history + %s new tokens (%s, idle, the router's cost model)", report.Tokens(history), report.Tokens(fresh), model),
		Header: []string{"setup", "no cache", "with the prefix caches", "speed-up", "path (no cache / cache)"}}
	for _, k := range order {
		a, ok := agent[k]
		if !ok {
			continue
		}
		t.Add(k, report.Duration(a.NoCacheS), report.Duration(a.CacheS), fmt.Sprintf("%.0fx", a.NoCacheS/a.CacheS), a.TargetNo+" / "+a.TargetCache)
	}
	return t
}
