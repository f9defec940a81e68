package safetensors

import (
	"cmp"
	"slices"
)

// Run is a contiguous byte range of one file.
type Run struct {
	File           string
	Offset, Length int64
}

// span is a byte range of the shard with index file, for sorting.
type span struct {
	file     int
	off, end int64
}

// Runs returns the byte ranges of the named tensors, coalesced into maximal
// contiguous runs per file and ordered by (file, offset). Empty tensors add
// nothing; a name given twice counts once; an unknown name, or one whose
// shard is a stub (StubsFile), is an error.
func (c *Checkpoint) Runs(names []string) ([]Run, error) {
	spans := make([]span, 0, len(names))
	for _, n := range names {
		e, err := c.data(n)
		if err != nil {
			return nil, err
		}
		spans = append(spans, e.span())
	}
	return c.coalesce(spans), nil
}

// GroupRuns partitions the tensors by key (those for which key reports
// false are left out) and returns each group's coalesced runs, as Runs
// would, stubs included (NeedData checks a group's tensors). With a key that maps a tensor name to its decoder layer, this is
// the per-layer byte-range index a weight streamer reads by.
func (c *Checkpoint) GroupRuns(key func(name string) (group int, ok bool)) map[int][]Run {
	groups := make(map[int][]span)
	for _, n := range c.names {
		if g, ok := key(n); ok {
			groups[g] = append(groups[g], c.tensors[n].span())
		}
	}
	out := make(map[int][]Run, len(groups))
	for g, spans := range groups {
		out[g] = c.coalesce(spans)
	}
	return out
}

func (e entry) span() span {
	return span{file: e.shard.idx, off: e.info.Offset, end: e.info.Offset + e.info.Size}
}

func (c *Checkpoint) coalesce(spans []span) []Run {
	slices.SortFunc(spans, func(a, b span) int {
		return cmp.Or(cmp.Compare(a.file, b.file), cmp.Compare(a.off, b.off))
	})
	var runs []Run
	for _, s := range spans {
		if s.end == s.off {
			continue
		}
		if n := len(runs); n > 0 && runs[n-1].File == c.shards[s.file].path && s.off <= runs[n-1].Offset+runs[n-1].Length {
			last := &runs[n-1]
			last.Length = max(last.Length, s.end-last.Offset)
			continue
		}
		runs = append(runs, Run{File: c.shards[s.file].path, Offset: s.off, Length: s.end - s.off})
	}
	return runs
}
