// Package layout is what a checkpoint directory must hold for tandem: it
// verifies a directory against its config and index without reading tensor
// data (Verify), lists the shards a layer range needs (Needed) and copies
// exactly those for one decode rank (Copy).
//
// What the config implies is the released layout (model/synth.Plan, the
// same table `bench mkmodel` writes and the binder checks shapes against):
// every text tensor's name, dtype and shape. Tensors the text config does
// not imply (the vision tower) are left alone.
package layout

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/synth"
)

// Range is a part of the model: layers [Lo, Hi) and, with Globals, the
// model-level tensors (embedding, final norm, output mix, lm_head), which
// a decode group's first and last ranks bind.
type Range struct {
	Lo, Hi  int
	Globals bool
}

// Whole is the whole model of cfg.
func Whole(cfg *model.Config) Range { return Range{Lo: 0, Hi: cfg.NumLayers, Globals: true} }

// Holds reports whether the range covers the text tensor name.
func (r Range) Holds(name string) bool {
	L, ok := model.LayerOf(name)
	switch {
	case !ok:
		return false
	case L == model.GlobalsGroup:
		return r.Globals
	}
	return L >= r.Lo && L < r.Hi
}

func (r Range) String() string {
	s := fmt.Sprintf("layers %d-%d", r.Lo, r.Hi-1)
	if r.Hi-r.Lo == 1 {
		s = fmt.Sprintf("layer %d", r.Lo)
	}
	if r.Globals {
		s += " and the model-level tensors"
	}
	return s
}

// Validate checks the range against cfg.
func (r Range) Validate(cfg *model.Config) error {
	if r.Lo < 0 || r.Lo >= r.Hi || r.Hi > cfg.NumLayers {
		return fmt.Errorf("layers %d-%d: want 0 <= first <= last < %d (the model's layers)", r.Lo, r.Hi-1, cfg.NumLayers)
	}
	return nil
}

// Problem is one thing wrong with a checkpoint directory: the file (and
// tensor, when one) and what is wrong, with what was expected and found.
type Problem struct {
	File   string // a shard, the index or config.json (base name)
	Tensor string
	What   string
}

func (p Problem) String() string {
	if p.Tensor != "" {
		return fmt.Sprintf("%s: tensor %s: %s", p.File, p.Tensor, p.What)
	}
	return fmt.Sprintf("%s: %s", p.File, p.What)
}

// Report is what Verify found.
type Report struct {
	Range    Range
	Shards   []string // the shard files the range needs, sorted
	Tensors  int      // tensors the config implies in the range
	Bytes    int64    // their data bytes
	Problems []Problem
}

// OK reports whether nothing is wrong.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// maxProblems bounds a report: a directory missing everything still gets
// a readable answer (the count of the rest is the last problem).
const maxProblems = 200

func (r *Report) add(p Problem) {
	switch n := len(r.Problems); {
	case n < maxProblems:
		r.Problems = append(r.Problems, p)
	case n == maxProblems:
		r.Problems = append(r.Problems, Problem{File: "(more)", What: "further problems not listed"})
	}
}

// Open reads dir's config.json and index: the two files everything else is
// checked against. An error here means the directory cannot be checked at
// all.
func Open(dir string) (*model.Config, *safetensors.Index, error) {
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, nil, err
	}
	idx, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexName))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", safetensors.IndexName, err)
	}
	return cfg, idx, nil
}

// Verify checks dir against its config and index for the range r (nil:
// the whole model), reading config.json, the index and the headers of the
// shards the range needs, never tensor data: every tensor the config
// implies in the range is in the index, in the shard the index names,
// with the dtype and shape the config implies; every shard the range needs
// exists and has the size its header implies. The error is for a
// directory that cannot be checked (no readable config or index); what is
// wrong with one that can is in the report.
func Verify(dir string, r *Range) (*Report, error) {
	cfg, idx, err := Open(dir)
	if err != nil {
		return nil, err
	}
	rg := Whole(cfg)
	if r != nil {
		if err := r.Validate(cfg); err != nil {
			return nil, err
		}
		rg = *r
	}
	copied, err := readCopied(dir)
	if err != nil {
		return nil, err
	}
	rep := &Report{Range: rg}
	want := implied(cfg, rg)
	rep.Tensors = len(want)
	byShard := map[string][]synth.Tensor{}
	for _, t := range want {
		rep.Bytes += t.Bytes()
		file, ok := idx.WeightMap[t.Name]
		if !ok {
			rep.add(Problem{File: safetensors.IndexName, Tensor: t.Name, What: fmt.Sprintf("missing: the config implies %s %v", t.DType, t.Shape)})
			continue
		}
		byShard[file] = append(byShard[file], t)
	}
	for f := range byShard {
		rep.Shards = append(rep.Shards, f)
	}
	sort.Strings(rep.Shards)
	for _, f := range rep.Shards {
		if isStub(copied, f) {
			rep.add(Problem{File: f, What: fmt.Sprintf("a header-only stub: this directory holds the data of %s only (%s), and %s needs this shard's", copied, CopyFile, rg)})
			continue
		}
		verifyShard(dir, f, byShard[f], idx, rep)
	}
	return rep, nil
}

// implied is the tensors the config implies in range r, in name order.
func implied(cfg *model.Config, r Range) []synth.Tensor {
	var out []synth.Tensor
	for _, t := range synth.Plan(cfg).All() {
		if r.Holds(t.Name) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b synth.Tensor) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// verifyShard checks one shard file: present, its header readable, the
// size its header implies, and the tensors want expected in it.
func verifyShard(dir, file string, want []synth.Tensor, idx *safetensors.Index, rep *Report) {
	if !plainName(file) {
		rep.add(Problem{File: safetensors.IndexName, Tensor: want[0].Name, What: fmt.Sprintf("maps it to %q, which is not a file name inside the directory", file)})
		return
	}
	path := filepath.Join(dir, file)
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		rep.add(Problem{File: file, What: fmt.Sprintf("missing: the index maps %d of the range's tensors to it (e.g. %s)", len(want), want[0].Name)})
		return
	case err != nil:
		rep.add(Problem{File: file, What: err.Error()})
		return
	case !st.Mode().IsRegular():
		rep.add(Problem{File: file, What: "not a regular file"})
		return
	}
	h, err := readHeader(path)
	if err != nil {
		rep.add(Problem{File: file, What: fmt.Sprintf("unreadable header (%d bytes on disk): %v", st.Size(), unwrap(err))})
		return
	}
	end := h.DataStart
	have := make(map[string]safetensors.TensorInfo, len(h.Tensors))
	for _, t := range h.Tensors {
		have[t.Name] = t
		end = max(end, t.Offset+t.Size)
	}
	if st.Size() != end {
		what := fmt.Sprintf("%d bytes, its header implies %d", st.Size(), end)
		if st.Size() < end {
			what += fmt.Sprintf(" (truncated: %d bytes missing)", end-st.Size())
		} else {
			what += fmt.Sprintf(" (%d bytes past the last tensor)", st.Size()-end)
		}
		rep.add(Problem{File: file, What: what})
	}
	for _, t := range want {
		got, ok := have[t.Name]
		switch {
		case !ok:
			rep.add(Problem{File: file, Tensor: t.Name, What: fmt.Sprintf("missing from the shard's header (the index maps it here; the config implies %s %v)", t.DType, t.Shape)})
		case got.DType != t.DType:
			rep.add(Problem{File: file, Tensor: t.Name, What: fmt.Sprintf("dtype %s, the config implies %s", got.DType, t.DType)})
		case !slices.Equal(got.Shape, t.Shape):
			rep.add(Problem{File: file, Tensor: t.Name, What: fmt.Sprintf("shape %v, the config implies %v", got.Shape, t.Shape)})
		}
	}
	// A tensor the header holds that the index maps elsewhere (or not at
	// all) makes the loader refuse the directory.
	for _, t := range h.Tensors {
		if m, ok := idx.WeightMap[t.Name]; !ok {
			rep.add(Problem{File: file, Tensor: t.Name, What: "in the shard's header but not in the index"})
		} else if m != file {
			rep.add(Problem{File: file, Tensor: t.Name, What: fmt.Sprintf("in the shard's header, but the index maps it to %s", m)})
		}
	}
}

// readHeader parses a shard's header whatever the file's length, so that a
// truncated shard is reported by the sizes its header implies rather than
// by the first tensor that runs past its end.
func readHeader(path string) (*safetensors.Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return safetensors.ParseHeader(f, math.MaxInt64, path)
}

func unwrap(err error) error {
	var se *safetensors.Error
	if errors.As(err, &se) && se.Err != nil {
		return se.Err
	}
	return err
}

func plainName(f string) bool {
	return f != "" && f != "." && f != ".." && !strings.ContainsAny(f, `/\`) && filepath.Base(f) == f
}

// Shard is a shard file a range needs.
type Shard struct {
	File    string
	Size    int64 // bytes on disk; -1 when the file is missing
	Tensors int   // tensors of the range in it
}

// Needed lists the shards of dir that hold tensors of range r, by the
// index, in file order.
func Needed(dir string, r Range) ([]Shard, error) {
	cfg, idx, err := Open(dir)
	if err != nil {
		return nil, err
	}
	if err := r.Validate(cfg); err != nil {
		return nil, err
	}
	return needed(dir, idx, r), nil
}

func needed(dir string, idx *safetensors.Index, r Range) []Shard {
	count := map[string]int{}
	for name, file := range idx.WeightMap {
		if r.Holds(name) {
			count[file]++
		}
	}
	out := make([]Shard, 0, len(count))
	for f, n := range count {
		s := Shard{File: f, Size: -1, Tensors: n}
		if st, err := os.Stat(filepath.Join(dir, f)); err == nil && plainName(f) {
			s.Size = st.Size()
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Shard) int { return strings.Compare(a.File, b.File) })
	return out
}
