package service

import (
	"testing"
	"time"

	"github.com/tandem-inference/tandem/configs"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/modelconfig"
	"github.com/tandem-inference/tandem/internal/prefixkey"
)

// TestRemoteCachesChooseThePath: how a prompt would use the prefill
// worker's store and the group's cache (remoteCaches), and the path the
// router chooses through the one cost model when one holds the prompt's
// prefix and the other does not. The group's prefill runs the whole prompt
// in 5 s, the prefill worker's in 10 s (its pass floor 1 s): a group that
// holds the history serves the new turn itself; a prefill worker that
// holds it serves it, though without its store the group would; with
// neither, the group.
func TestRemoteCachesChooseThePath(t *testing.T) {
	const n = 8001
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(i * 7 % 251)
	}
	salt := prefixkey.Salt("m", 2)
	chain := prefixkey.Chain(prefixkey.SHA256, salt, prompt)
	holding := func(w cp.WorkerInfo, on bool, tokens ...int) cp.WorkerInfo {
		if on {
			w.PrefixCache = &cp.PrefixCacheInfo{Salt: uint64(salt)}
			for _, k := range tokens {
				w.PrefixCache.Prefixes = append(w.PrefixCache.Prefixes, cp.CachedPrefix{Link: uint64(chain[k/64-1]), Tokens: k})
			}
		}
		return w
	}
	pf := func(on bool, tokens ...int) cp.WorkerInfo {
		return holding(cp.WorkerInfo{ID: "prefill-0", Kind: cp.KindPrefill}, on, tokens...)
	}
	head := func(on bool, tokens ...int) cp.WorkerInfo {
		return holding(cp.WorkerInfo{ID: "g-r0", Kind: cp.KindDecode}, on, tokens...)
	}

	for _, tc := range []struct {
		name                    string
		pf, h                   cp.WorkerInfo
		split, cached, appendTo int
	}{
		{"store off", pf(false), head(true, 4096), 0, 0, 0},
		{"group cache off", pf(true, 4096), head(false), 0, 0, 0},
		{"both on, nothing held", pf(true), head(true), 8000, 0, 0},
		{"both hold", pf(true, 4096, 7936), head(true, 4096), 8000, 7936, 4096},
		{"the group holds past the split", pf(true), head(true, 7936, 8000), 8000, 0, 7936},
		{"a short prompt", pf(true), head(true), 0, 0, 0},
	} {
		p := prompt
		if tc.name == "a short prompt" {
			p = prompt[:60]
		}
		split, cached, appendTo := remoteCaches(&tc.pf, &tc.h, p)
		if split != tc.split || cached != tc.cached || appendTo != tc.appendTo {
			t.Errorf("%s: split %d, store %d, append to %d; want %d, %d, %d", tc.name, split, cached, appendTo, tc.split, tc.cached, tc.appendTo)
		}
	}

	b, err := configs.ModelPreset("small")
	if err != nil {
		t.Fatal(err)
	}
	mc, err := modelconfig.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	m := costmodel.New(mc, 2)
	gflops := m.Work(0, n-1).Total() / 1e9
	r := router.Rates{PassFloor: time.Second, Prefill: costmodel.Uniform(gflops/10, 0), Local: costmodel.Uniform(gflops/5, 0),
		LinkBytesPerS: 1e9, DecodeStep: 10 * time.Millisecond}
	route := func(pf, h cp.WorkerInfo) router.Decision {
		l := router.Load{PrefillUp: true, LocalChunk: 512}
		l.LocalCached = cachedPrefix(&h, prompt)
		l.RemoteSplit, l.RemoteCached, l.RemoteAppend = remoteCaches(&pf, &h, prompt)
		return router.Route(router.Auto, m, r, l, n)
	}
	for _, tc := range []struct {
		name  string
		pf, h cp.WorkerInfo
		want  router.Target
	}{
		{"the group holds the history", pf(true), head(true, 7936), router.TargetLocal},
		{"the store holds the history", pf(true, 7936), head(true), router.TargetRemote},
		{"the same history, no store", pf(false), head(true), router.TargetLocal},
		{"both hold it", pf(true, 7936), head(true, 7936), router.TargetLocal},
		{"neither", pf(true), head(true), router.TargetLocal},
	} {
		if d := route(tc.pf, tc.h); d.Target != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, d.Target, d.Reason, tc.want)
		}
	}
}
