package kvtransfer

import (
	"fmt"
	"slices"
	"sort"

	"github.com/tandem-inference/tandem/model"
)

// Placement says which decode rank receives which bytes of each layer's state.
//
// Pipeline-parallel placement (LayerMap) sends a whole layer to the one rank
// that owns it. The interface also fits tensor-parallel placement: a part can
// be sent whole to several ranks (MLA rows to every rank), or split into byte
// ranges (KDA heads are contiguous in the state and in the conv tails), each
// range becoming the whole of that rank's own, smaller part.
type Placement interface {
	// Routes returns the destinations of part kind (size bytes, shape shape)
	// of layer L. At most one route per endpoint and part.
	Routes(L int, kind model.PartKind, size int, shape []int) ([]Route, error)
	// Endpoints lists every endpoint the placement can route to, so that a
	// sender can connect before the first layer is ready, and tell every
	// receiver when the sequence is complete.
	Endpoints() []string
}

// Route is one destination of a part: bytes [Off, Off+Len) of the sender's
// part are the whole of the receiver's part, whose shape is Shape (nil: the
// sender's shape, which needs Off 0 and Len the whole part).
type Route struct {
	Endpoint string
	Off, Len int
	Shape    []int
}

// LayerMap is pipeline-parallel placement: layer -> the endpoint ("host:port"
// of its rank's Server) that owns it.
type LayerMap map[int]string

// Routes sends the whole part to the layer's owner.
func (m LayerMap) Routes(L int, kind model.PartKind, size int, shape []int) ([]Route, error) {
	ep, ok := m[L]
	if !ok {
		return nil, fmt.Errorf("placement has no owner for layer %d", L)
	}
	return []Route{{Endpoint: ep, Off: 0, Len: size}}, nil
}

// Endpoints lists the distinct endpoints, sorted.
func (m LayerMap) Endpoints() []string {
	seen := map[string]bool{}
	var out []string
	for _, ep := range m {
		if !seen[ep] {
			seen[ep] = true
			out = append(out, ep)
		}
	}
	sort.Strings(out)
	return out
}

// Layers returns the layers owned by endpoint ep, sorted: what that rank's
// ExpectSpec.Layers must be.
func (m LayerMap) Layers(ep string) []int {
	var out []int
	for L, e := range m {
		if e == ep {
			out = append(out, L)
		}
	}
	sort.Ints(out)
	return out
}

// Contiguous builds a LayerMap giving consecutive runs of numLayers layers to
// the endpoints in order, as even as possible (the first ranks get the extra
// layers): the usual pipeline split of a decode group.
func Contiguous(numLayers int, endpoints []string) (LayerMap, error) {
	if len(endpoints) == 0 || numLayers < len(endpoints) {
		return nil, fmt.Errorf("cannot split %d layers over %d endpoints", numLayers, len(endpoints))
	}
	m := make(LayerMap, numLayers)
	L := 0
	for i, ep := range endpoints {
		n := numLayers / len(endpoints)
		if i < numLayers%len(endpoints) {
			n++
		}
		for j := 0; j < n; j++ {
			m[L] = ep
			L++
		}
	}
	return m, nil
}

// Dest is one rank a layer goes to: its endpoint and its tensor shard
// (zero: the rank holds the layer unsplit).
type Dest struct {
	Endpoint string
	Shard    model.Shard
}

// Sharded is tensor-parallel placement: each layer goes to every rank of
// its stage, each getting its shard's slice as model.Config.ShardLayerState
// cuts it. KDA parts are cut by rows (model.Config.ShardRows), each slice a
// byte range of the sender's part, so the bytes sent per rank shrink by the
// tensor size; the MLA latent cache goes whole to every rank (an append's
// rows too). Build it with NewSharded.
type Sharded struct {
	model  *model.Config
	layers map[int][]Dest
	eps    []string
}

// NewSharded builds the placement of layers (layer -> its stage's ranks),
// checking that each layer's ranks have distinct endpoints and shards that
// are all unsplit or complete the tensor ranks 0..T-1 of one size T, which
// divides the model's KDA heads.
func NewSharded(c *model.Config, layers map[int][]Dest) (*Sharded, error) {
	p := &Sharded{model: c, layers: map[int][]Dest{}}
	seen := map[string]bool{}
	for L, ds := range layers {
		if L < 0 || L >= c.NumLayers {
			return nil, fmt.Errorf("placement: layer %d outside the model's 0..%d", L, c.NumLayers-1)
		}
		if err := checkDests(c, L, ds); err != nil {
			return nil, err
		}
		p.layers[L] = slices.Clone(ds)
		for _, d := range ds {
			if !seen[d.Endpoint] {
				seen[d.Endpoint] = true
				p.eps = append(p.eps, d.Endpoint)
			}
		}
	}
	sort.Strings(p.eps)
	return p, nil
}

// checkDests checks one layer's ranks (see NewSharded).
func checkDests(c *model.Config, L int, ds []Dest) error {
	if len(ds) == 0 {
		return fmt.Errorf("placement: layer %d has no rank", L)
	}
	T := max(ds[0].Shard.Ranks, 1)
	if err := c.CheckShard(T); err != nil {
		return fmt.Errorf("placement: layer %d: %w", L, err)
	}
	if len(ds) != T {
		return fmt.Errorf("placement: layer %d has %d ranks for tensor %d: a stage has one rank per tensor rank", L, len(ds), T)
	}
	have := make([]bool, T)
	for i, d := range ds {
		switch {
		case d.Endpoint == "":
			return fmt.Errorf("placement: layer %d rank %d has no endpoint", L, i)
		case max(d.Shard.Ranks, 1) != T:
			return fmt.Errorf("placement: layer %d mixes tensor sizes %d and %d", L, T, max(d.Shard.Ranks, 1))
		case d.Shard.Rank < 0 || d.Shard.Rank >= T || have[d.Shard.Rank]:
			return fmt.Errorf("placement: layer %d: tensor rank %d missing, repeated or outside 0..%d", L, d.Shard.Rank, T-1)
		}
		have[d.Shard.Rank] = true
		for _, e := range ds[:i] {
			if e.Endpoint == d.Endpoint {
				return fmt.Errorf("placement: layer %d goes to %s twice", L, d.Endpoint)
			}
		}
	}
	return nil
}

// Routes sends each rank of layer L's stage its slice of the part.
func (p *Sharded) Routes(L int, kind model.PartKind, size int, shape []int) ([]Route, error) {
	ds, ok := p.layers[L]
	if !ok {
		return nil, fmt.Errorf("placement has no rank for layer %d", L)
	}
	out := make([]Route, 0, len(ds))
	for _, d := range ds {
		off, n, sub, err := p.model.ShardSpan(kind, shape, size, d.Shard)
		if err != nil {
			return nil, err
		}
		out = append(out, Route{Endpoint: d.Endpoint, Off: off, Len: n, Shape: sub})
	}
	return out, nil
}

// Endpoints lists the distinct endpoints, sorted.
func (p *Sharded) Endpoints() []string { return slices.Clone(p.eps) }

// Layers returns the layers endpoint ep receives, sorted, and its shard:
// what that rank's ExpectSpec.Layers and Shard must be.
func (p *Sharded) Layers(ep string) ([]int, model.Shard) {
	var out []int
	var s model.Shard
	for L, ds := range p.layers {
		for _, d := range ds {
			if d.Endpoint == ep {
				out, s = append(out, L), d.Shard
			}
		}
	}
	sort.Ints(out)
	return out, s
}
