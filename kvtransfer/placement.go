package kvtransfer

import (
	"fmt"
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
