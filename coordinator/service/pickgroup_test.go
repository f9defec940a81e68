package service

import (
	"slices"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/prefixkey"
)

// TestPickGroupPrefersTheCachedPrefix: among groups with room, a prompt
// goes to the one whose head advertises the longest prefix of it in its
// prefix cache; room now still comes first, and load breaks ties.
func TestPickGroupPrefersTheCachedPrefix(t *testing.T) {
	prompt := make([]int32, 300)
	for i := range prompt {
		prompt[i] = int32(i * 7 % 251)
	}
	salt := prefixkey.Salt("m", 2)
	chain := prefixkey.Chain(prefixkey.SHA256, salt, prompt)
	head := func(id string, tokens ...int) cp.WorkerInfo {
		w := cp.WorkerInfo{ID: id, Kind: cp.KindDecode}
		if len(tokens) > 0 {
			w.PrefixCache = &cp.PrefixCacheInfo{Salt: uint64(salt)}
			for _, n := range tokens {
				w.PrefixCache.Prefixes = append(w.PrefixCache.Prefixes, cp.CachedPrefix{Link: uint64(chain[n/64-1]), Tokens: n})
			}
		}
		return w
	}
	g := func(id string, free, active int, h cp.WorkerInfo) group {
		return group{ID: id, Ranks: []cp.WorkerInfo{h}, Capacity: 10000, Free: free, Active: active}
	}
	for _, tc := range []struct {
		name string
		gs   []group
		want string
	}{
		{"the longest cached prefix", []group{g("a", 5000, 0, head("a-r0", 64)), g("b", 5000, 3, head("b-r0", 64, 256)), g("c", 5000, 0, head("c-r0"))}, "b"},
		{"room now first", []group{g("a", 100, 0, head("a-r0", 256)), g("b", 5000, 3, head("b-r0"))}, "b"},
		{"no cache anywhere: the least loaded", []group{g("a", 5000, 2, head("a-r0")), g("b", 5000, 1, head("b-r0"))}, "b"},
		{"another model's salt matches nothing", []group{g("a", 5000, 0, func() cp.WorkerInfo {
			w := head("a-r0", 256)
			w.PrefixCache.Salt++
			return w
		}()), g("b", 5000, 0, head("b-r0", 64))}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickGroup(tc.gs, 400, prompt); got == nil || got.ID != tc.want {
				t.Fatalf("picked %v, want %s", got, tc.want)
			}
		})
	}
	h := head("x", 256)
	if n := cachedPrefix(&h, prompt); n != 256 {
		t.Fatalf("cachedPrefix %d, want 256", n)
	}
	if n := cachedPrefix(&h, prompt[:256]); n != 0 {
		t.Fatalf("cachedPrefix of a prompt of exactly the cached length %d: the last token must run", n)
	}
	// The prefill steps of the rest end where the group keeps its state.
	h.PrefixCache.Stride = 128
	if got, want := snapshotStops(&h, 256, 600), []int{384, 512, 576}; !slices.Equal(got, want) {
		t.Errorf("snapshotStops from 256 of a 600-token prompt, stride 128: %v, want %v", got, want)
	}
	h.PrefixCache.Salt = 0 // the cache paused
	if got := snapshotStops(&h, 0, 600); got != nil {
		t.Errorf("snapshotStops of a paused cache: %v", got)
	}
}
