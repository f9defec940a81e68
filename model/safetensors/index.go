package safetensors

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// IndexName is the file that maps tensor names to shards.
const IndexName = "model.safetensors.index.json"

// maxIndexSize bounds a decompressed index (the real K3 one is 60 MB).
const maxIndexSize = 1 << 30

// Index is a parsed model.safetensors.index.json.
type Index struct {
	TotalSize int64             // metadata.total_size: bytes of tensor data in all shards
	WeightMap map[string]string // tensor name -> shard file name
}

// ReadIndex reads an index, gzip-compressed or not (told by its first
// bytes). Every weight_map value must be a non-empty string, and a name
// given twice is an error even when both give the same file.
func ReadIndex(path string) (*Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, &Error{File: path, Err: fmt.Errorf("%w: gzip: %w", ErrSyntax, err)}
		}
		defer zr.Close()
		r = zr
	}
	b, err := io.ReadAll(io.LimitReader(r, maxIndexSize+1))
	if err != nil {
		return nil, &Error{File: path, Err: fmt.Errorf("reading: %w", err)}
	}
	if len(b) > maxIndexSize {
		return nil, &Error{File: path, Err: fmt.Errorf("%w: the index exceeds %d bytes", ErrHeaderSize, maxIndexSize)}
	}
	idx, tensor, err := parseIndex(b)
	if err != nil {
		return nil, &Error{File: path, Tensor: tensor, Err: err}
	}
	return idx, nil
}

// parseIndex parses the index JSON. The weight_map, half a million entries
// for K3, is scanned by hand: it is an object of strings only, and a direct
// scan is several times faster than encoding/json while still catching
// duplicate names, which encoding/json would silently merge. It returns the
// offending tensor name with an error where one applies.
func parseIndex(b []byte) (*Index, string, error) {
	s := &jsonScanner{b: b}
	idx := &Index{}
	var sawMap bool
	err := s.object(func(key string) error {
		switch key {
		case "metadata":
			var md map[string]any
			if err := s.decode(&md); err != nil {
				return fmt.Errorf("metadata: %w", err)
			}
			if ts, ok := md["total_size"]; ok {
				var err error
				idx.TotalSize, err = totalSize(ts)
				return err
			}
			return nil
		case "weight_map":
			if sawMap {
				return fmt.Errorf("%w: weight_map appears twice", ErrSyntax)
			}
			sawMap = true
			return s.weightMap(idx)
		}
		var skip json.RawMessage // other top-level fields are not ours to judge
		return s.decode(&skip)
	})
	if err != nil {
		name, _ := errors.AsType[*nameError](err)
		return nil, name.tensor(), err
	}
	if s.ws(); s.i != len(b) {
		return nil, "", fmt.Errorf("%w: trailing data at byte %d after the index object", ErrSyntax, s.i)
	}
	if !sawMap {
		return nil, "", fmt.Errorf("%w: no weight_map", ErrSyntax)
	}
	return idx, "", nil
}

// nameError carries the tensor name an index error concerns.
type nameError struct {
	name string
	err  error
}

func (e *nameError) Error() string { return e.err.Error() }
func (e *nameError) Unwrap() error { return e.err }
func (e *nameError) tensor() string {
	if e == nil {
		return ""
	}
	return e.name
}

func (s *jsonScanner) weightMap(idx *Index) error {
	idx.WeightMap = make(map[string]string)
	files := make(map[string]string) // a few shard names, shared by all entries
	return s.object(func(name string) error {
		fail := func(err error) error { return &nameError{name, err} }
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return fail(fmt.Errorf("%w: byte %d: the weight_map value is not a file name", ErrSyntax, s.i))
		}
		raw, esc, err := s.stringBytes()
		if err != nil {
			return fail(err)
		}
		file, ok := files[string(raw)]
		if !ok {
			if file, err = s.unquote(raw, esc); err != nil {
				return fail(err)
			}
			files[string(raw)] = file
		}
		if file == "" {
			return fail(fmt.Errorf("%w: the weight_map value is an empty file name", ErrSyntax))
		}
		if _, dup := idx.WeightMap[name]; dup {
			return fail(fmt.Errorf("%w: the name appears twice in weight_map", ErrDuplicate))
		}
		idx.WeightMap[name] = file
		return nil
	})
}

// jsonScanner reads JSON objects with string keys from b.
type jsonScanner struct {
	b []byte
	i int
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *jsonScanner) syntax(what string) error {
	if s.i >= len(s.b) {
		return fmt.Errorf("%w: the input ends where %s belongs", ErrSyntax, what)
	}
	return fmt.Errorf("%w: byte %d: found %q where %s belongs", ErrSyntax, s.i, s.b[s.i], what)
}

// object parses {"key": value, ...}, calling member with the scanner at
// each value, which member must consume.
func (s *jsonScanner) object(member func(key string) error) error {
	if s.ws(); s.i >= len(s.b) || s.b[s.i] != '{' {
		return s.syntax("an object")
	}
	s.i++
	if s.ws(); s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.syntax("a name")
		}
		raw, esc, err := s.stringBytes()
		if err != nil {
			return err
		}
		key, err := s.unquote(raw, esc)
		if err != nil {
			return err
		}
		if s.ws(); s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.syntax("':'")
		}
		s.i++
		s.ws()
		if err := member(key); err != nil {
			return err
		}
		s.ws()
		switch {
		case s.i < len(s.b) && s.b[s.i] == ',':
			s.i++
		case s.i < len(s.b) && s.b[s.i] == '}':
			s.i++
			return nil
		default:
			return s.syntax("',' or '}'")
		}
	}
}

// stringBytes consumes a JSON string and returns its raw contents and
// whether they hold escapes. Names without escapes, nearly all of them, are
// found with bytes.IndexByte and checked a word at a time.
func (s *jsonScanner) stringBytes() (raw []byte, escaped bool, err error) {
	start := s.i + 1
	if k := bytes.IndexByte(s.b[start:], '"'); k >= 0 && bytes.IndexByte(s.b[start:start+k], '\\') < 0 {
		raw = s.b[start : start+k]
		if hasControl(raw) {
			return nil, false, fmt.Errorf("%w: byte %d: a control character inside the string", ErrSyntax, s.i)
		}
		s.i = start + k + 1
		return raw, false, nil
	}
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return s.b[start:j], true, nil
		case c == '\\':
			j++
		case c < 0x20:
			return nil, false, fmt.Errorf("%w: byte %d: a control character inside a string", ErrSyntax, j)
		}
	}
	return nil, false, fmt.Errorf("%w: byte %d: unterminated string", ErrSyntax, s.i)
}

// hasControl reports whether b holds a byte below 0x20, which JSON strings
// may not contain raw. It tests eight bytes per step: w - 0x20.. borrows
// into a byte's top bit exactly when some byte is below 0x20 (and the top
// bit was clear, the &^ w).
func hasControl(b []byte) bool {
	const ones, highs = 0x2020202020202020, 0x8080808080808080
	for ; len(b) >= 8; b = b[8:] {
		w := binary.LittleEndian.Uint64(b)
		if (w-ones)&^w&highs != 0 {
			return true
		}
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// unquote turns raw string contents into a Go string: directly when there
// are no escapes, else through encoding/json, which knows them all.
func (s *jsonScanner) unquote(raw []byte, escaped bool) (string, error) {
	if !escaped {
		if !utf8.Valid(raw) {
			return "", fmt.Errorf("%w: a string that is not valid UTF-8", ErrSyntax)
		}
		return string(raw), nil
	}
	var out string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	if err := json.Unmarshal(q, &out); err != nil {
		return "", fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return out, nil
}

// decode reads one JSON value at the scanner into v with encoding/json
// (numbers as json.Number) and moves past it.
func (s *jsonScanner) decode(v any) error {
	dec := json.NewDecoder(bytes.NewReader(s.b[s.i:]))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: byte %d: %w", ErrSyntax, s.i, err)
	}
	s.i += int(dec.InputOffset())
	return nil
}

// totalSize accepts an integer, or a float with an integral value (some
// writers emit 1.5e9).
func totalSize(v any) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%w: metadata.total_size %v is not a number", ErrSyntax, v)
	}
	if i, err := n.Int64(); err == nil && i >= 0 {
		return i, nil
	}
	f, err := n.Float64()
	if err != nil || f < 0 || f != math.Trunc(f) || f > math.MaxInt64 {
		return 0, fmt.Errorf("%w: metadata.total_size %s is not a byte count", ErrSyntax, n)
	}
	return int64(f), nil
}

// WriteIndex writes an index in the released shape,
// {"metadata":{"total_size":N},"weight_map":{...}} with sorted names and
// two-space indentation, gzip-compressed when path ends in ".gz". It writes
// a temporary file and renames it into place.
func WriteIndex(path string, idx *Index) error {
	var doc struct {
		Metadata struct {
			TotalSize int64 `json:"total_size"`
		} `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	doc.Metadata.TotalSize = idx.TotalSize
	doc.WeightMap = idx.WeightMap
	if doc.WeightMap == nil {
		doc.WeightMap = map[string]string{}
	}
	return writeAtomic(path, -1, func(w io.Writer) error {
		if strings.HasSuffix(path, ".gz") {
			zw := gzip.NewWriter(w)
			if err := encodeIndex(zw, &doc); err != nil {
				return err
			}
			return zw.Close()
		}
		return encodeIndex(w, &doc)
	})
}

func encodeIndex(w io.Writer, doc any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// writeAtomic writes path through a temporary file in the same directory,
// synced and renamed into place, so that readers never see a partial file.
// A size >= 0 then sets the file's length: what lies past the written bytes
// is a hole that reads as zeros.
func writeAtomic(path string, size int64, write func(w io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if size >= 0 {
		if err = f.Truncate(size); err != nil {
			return fmt.Errorf("extending %s to %d bytes: %w", tmp, size, err)
		}
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return nil
}
