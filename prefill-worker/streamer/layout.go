package streamer

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
)

// DefaultAlign is the direct-I/O alignment of file offsets, lengths and
// buffers: the largest logical block size of the devices we read from.
const DefaultAlign = 4096

// mergeGap is the largest hole between two runs of one layer in one file
// that is read through rather than split into two requests.
const mergeGap = 1 << 20

// Layout places every decoder layer's tensors in a slot: which aligned file
// ranges to read, where each lands in the slot, and where each tensor is.
// It is computed once from the checkpoint headers.
type Layout struct {
	Files  []string // shard paths, by file index
	Layers []LayerLayout
	Align  int
	// SlotBytes is the largest layer's slot size.
	SlotBytes int64
	// TensorBytes is the tensor data of all layers (what a pass needs);
	// ReadBytes what a pass reads, with alignment and merged holes.
	TensorBytes, ReadBytes int64
	// fileNeed[f] is how long file f must be for every extent, and
	// needLayer[f] the layer of the extent that reaches furthest.
	fileNeed  []int64
	needLayer []int
}

// LayerLayout is one layer's reads and tensor placement.
type LayerLayout struct {
	Layer   int
	Extents []Extent
	// TensorBytes is the layer's tensor data; ReadBytes the aligned bytes
	// read into its slot (the slot size it needs).
	TensorBytes, ReadBytes int64
	tensors                map[string]tensorAt
}

// Extent is one aligned read: Len bytes of file File from offset Off (both
// multiples of the alignment) into the slot at Buf. Only the first Need
// bytes must exist; the rest is alignment padding past the last tensor,
// which may run past the end of the file.
type Extent struct {
	File      int
	Off, Len  int64
	Need, Buf int64
}

type tensorAt struct {
	meta      model.TensorMeta
	off, size int64 // in the slot
}

// NewLayout lays out layers [0, layers) of the open checkpoint.
func NewLayout(ck *safetensors.Checkpoint, layers, align int) (*Layout, error) {
	if align <= 0 || align&(align-1) != 0 {
		return nil, fmt.Errorf("streamer: alignment %d is not a power of two", align)
	}
	lay := &Layout{Files: ck.Files(), Layers: make([]LayerLayout, layers), Align: align}
	fileIdx := make(map[string]int, len(lay.Files))
	for i, f := range lay.Files {
		fileIdx[f] = i
	}
	lay.fileNeed = make([]int64, len(lay.Files))
	lay.needLayer = make([]int, len(lay.Files))
	byLayer := make([][]safetensors.TensorInfo, layers)
	for _, name := range ck.Names() {
		L, ok := model.LayerOf(name)
		if !ok || L == model.GlobalsGroup {
			continue
		}
		if L >= layers {
			return nil, fmt.Errorf("streamer: tensor %s belongs to layer %d, but the model has %d layers", name, L, layers)
		}
		// The streamer reads the files itself: a stub's hole would
		// stream as zero weights.
		if err := ck.NeedData(name); err != nil {
			return nil, fmt.Errorf("streamer: %w", err)
		}
		t, _ := ck.Tensor(name)
		byLayer[L] = append(byLayer[L], t)
	}
	a := int64(align)
	for L, ts := range byLayer {
		if len(ts) == 0 {
			return nil, fmt.Errorf("streamer: layer %d has no tensors in %s", L, ck.Dir)
		}
		slices.SortFunc(ts, func(x, y safetensors.TensorInfo) int {
			return cmp.Or(cmp.Compare(fileIdx[x.File], fileIdx[y.File]), cmp.Compare(x.Offset, y.Offset))
		})
		ll := LayerLayout{Layer: L, tensors: make(map[string]tensorAt, len(ts))}
		// Merge the layer's tensors into runs per file (through holes up to
		// mergeGap), then widen each run to the alignment.
		type run struct {
			file     int
			off, end int64
		}
		var runs []run
		for _, t := range ts {
			f := fileIdx[t.File]
			if n := len(runs); n > 0 && runs[n-1].file == f && t.Offset <= runs[n-1].end+mergeGap {
				runs[n-1].end = max(runs[n-1].end, t.Offset+t.Size)
				continue
			}
			runs = append(runs, run{file: f, off: t.Offset, end: t.Offset + t.Size})
		}
		var buf int64
		for _, r := range runs {
			off := r.off / a * a
			end := (r.end + a - 1) / a * a
			ll.Extents = append(ll.Extents, Extent{File: r.file, Off: off, Len: end - off, Need: r.end - off, Buf: buf})
			buf += end - off
			if r.end > lay.fileNeed[r.file] {
				lay.fileNeed[r.file], lay.needLayer[r.file] = r.end, L
			}
		}
		ll.ReadBytes = buf
		for _, t := range ts {
			f := fileIdx[t.File]
			for _, e := range ll.Extents {
				if e.File == f && t.Offset >= e.Off && t.Offset+t.Size <= e.Off+e.Need {
					ll.tensors[t.Name] = tensorAt{
						meta: model.TensorMeta{DType: string(t.DType), Shape: t.Shape},
						off:  e.Buf + t.Offset - e.Off, size: t.Size,
					}
					break
				}
			}
			ll.TensorBytes += t.Size
		}
		lay.Layers[L] = ll
		lay.SlotBytes = max(lay.SlotBytes, ll.ReadBytes)
		lay.TensorBytes += ll.TensorBytes
		lay.ReadBytes += ll.ReadBytes
	}
	return lay, nil
}

// source is a model.TensorSource over a slot holding one layer.
type source struct {
	ll  *LayerLayout
	buf []byte
}

func (s *source) Meta(name string) (model.TensorMeta, bool) {
	t, ok := s.ll.tensors[name]
	return t.meta, ok
}

func (s *source) Data(name string) ([]byte, error) {
	t, ok := s.ll.tensors[name]
	if !ok {
		return nil, fmt.Errorf("tensor %s is not part of layer %d", name, s.ll.Layer)
	}
	end := t.off + t.size
	return s.buf[t.off:end:end], nil
}
