package msgpackscan

import (
	"encoding"
	"encoding/binary"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// CheckFor validates one msgpack value in b as Check does, then checks
// every integer in it against the Go type t it will be decoded into, the
// type a pointer passed to the decoder points to. It refuses, naming the
// field, an integer that the msgpack decoder would convert as a Go
// conversion does, such as 2^32+5 into an int32 or -1 into a uint64, as
// encoding/json refuses it, so that a message means the same in both
// encodings. A float where an integer is wanted, and a float64 where a
// float32 is, are left to the decoder, which refuses them.
func CheckFor(b []byte, t reflect.Type) error {
	if err := Check(b); err != nil {
		return err
	}
	w := walker{b: b}
	if err := w.value(t, 0); err != nil {
		return err
	}
	return nil
}

// RangeError is an integer that does not fit its destination.
type RangeError struct {
	Path  string // wire path of the field: "token_ids[3]", "sampling.seed"
	Value string // the integer as sent
	Type  reflect.Type
}

func (e *RangeError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("integer %s is out of range for %s", e.Value, e.Type)
	}
	return fmt.Sprintf("field %q: integer %s is out of range for %s", e.Path, e.Value, e.Type)
}

// prepend adds an outer path segment to a RangeError coming up from a
// nested value.
func prepend(err error, seg string) error {
	if re, ok := err.(*RangeError); ok {
		switch {
		case re.Path == "":
			re.Path = seg
		case strings.HasPrefix(re.Path, "["):
			re.Path = seg + re.Path
		default:
			re.Path = seg + "." + re.Path
		}
	}
	return err
}

// walker reads a value Check has accepted: every length is known to fit.
type walker struct {
	b []byte
	i int
}

var (
	timeType         = reflect.TypeFor[time.Time]()
	customDecoder    = reflect.TypeFor[msgpack.CustomDecoder]()
	msgpackUnmarshal = reflect.TypeFor[msgpack.Unmarshaler]()
	binaryUnmarshal  = reflect.TypeFor[encoding.BinaryUnmarshaler]()
	textUnmarshal    = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decodesItself reports whether the decoder hands t's bytes to t's own
// code, which then owns their meaning.
func decodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t == timeType || p.Implements(customDecoder) || p.Implements(msgpackUnmarshal) ||
		p.Implements(binaryUnmarshal) || p.Implements(textUnmarshal)
}

func (w *walker) value(t reflect.Type, depth int) error {
	for t.Kind() == reflect.Pointer {
		if w.b[w.i] == 0xc0 { // nil
			w.i++
			return nil
		}
		t = t.Elem()
	}
	if depth > MaxDepth || decodesItself(t) {
		w.skip()
		return nil
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		neg, mag, ok := w.integer()
		if !ok {
			w.skip()
			return nil
		}
		limit := uint64(1) << (t.Bits() - 1) // |min|; max is limit-1
		if (neg && mag > limit) || (!neg && mag >= limit) {
			return &RangeError{Value: intString(neg, mag), Type: t}
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		neg, mag, ok := w.integer()
		if !ok {
			w.skip()
			return nil
		}
		if neg || (t.Bits() < 64 && mag >= uint64(1)<<t.Bits()) {
			return &RangeError{Value: intString(neg, mag), Type: t}
		}
	case reflect.Struct:
		n, ok := w.mapLen()
		if !ok {
			w.skip()
			return nil
		}
		fields := cachedFields(t)
		for range n {
			key, isStr := w.str()
			ft, known := fields[key]
			if !isStr || !known {
				w.skip() // a non-string or unknown key: the decoder refuses it
				continue
			}
			if err := w.value(ft, depth+1); err != nil {
				return prepend(err, key)
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			w.skip()
			return nil
		}
		n, ok := w.arrayLen()
		if !ok {
			w.skip()
			return nil
		}
		for j := range n {
			if err := w.value(t.Elem(), depth+1); err != nil {
				return prepend(err, "["+strconv.FormatUint(j, 10)+"]")
			}
		}
	case reflect.Map:
		n, ok := w.mapLen()
		if !ok {
			w.skip()
			return nil
		}
		for range n {
			start := w.i
			key, isStr := w.str()
			if !isStr {
				w.i = start
				if err := w.value(t.Key(), depth+1); err != nil {
					return prepend(err, "[key]")
				}
			}
			if err := w.value(t.Elem(), depth+1); err != nil {
				return prepend(err, "["+strconv.Quote(key)+"]")
			}
		}
	default:
		w.skip()
	}
	return nil
}

func intString(neg bool, mag uint64) string {
	if neg {
		return "-" + strconv.FormatUint(mag, 10)
	}
	return strconv.FormatUint(mag, 10)
}

// integer reads an integer as sign and magnitude; ok is false (and nothing
// is read) when the next value is not an integer.
func (w *walker) integer() (neg bool, mag uint64, ok bool) {
	c := w.b[w.i]
	p := w.b[w.i+1:]
	switch {
	case c <= 0x7f:
		w.i++
		return false, uint64(c), true
	case c >= 0xe0:
		w.i++
		return true, uint64(-int64(int8(c))), true
	}
	var v int64
	var u uint64
	signed := true
	switch c {
	case 0xcc:
		u, signed, w.i = uint64(p[0]), false, w.i+2
	case 0xcd:
		u, signed, w.i = uint64(binary.BigEndian.Uint16(p)), false, w.i+3
	case 0xce:
		u, signed, w.i = uint64(binary.BigEndian.Uint32(p)), false, w.i+5
	case 0xcf:
		u, signed, w.i = binary.BigEndian.Uint64(p), false, w.i+9
	case 0xd0:
		v, w.i = int64(int8(p[0])), w.i+2
	case 0xd1:
		v, w.i = int64(int16(binary.BigEndian.Uint16(p))), w.i+3
	case 0xd2:
		v, w.i = int64(int32(binary.BigEndian.Uint32(p))), w.i+5
	case 0xd3:
		v, w.i = int64(binary.BigEndian.Uint64(p)), w.i+9
	default:
		return false, 0, false
	}
	if !signed {
		return false, u, true
	}
	if v < 0 {
		return true, uint64(-(v + 1)) + 1, true // -MinInt64 without overflow
	}
	return false, uint64(v), true
}

// mapLen reads a map header.
func (w *walker) mapLen() (uint64, bool) {
	c := w.b[w.i]
	switch {
	case c >= 0x80 && c <= 0x8f:
		w.i++
		return uint64(c & 0x0f), true
	case c == 0xde:
		n := binary.BigEndian.Uint16(w.b[w.i+1:])
		w.i += 3
		return uint64(n), true
	case c == 0xdf:
		n := binary.BigEndian.Uint32(w.b[w.i+1:])
		w.i += 5
		return uint64(n), true
	}
	return 0, false
}

// arrayLen reads an array header.
func (w *walker) arrayLen() (uint64, bool) {
	c := w.b[w.i]
	switch {
	case c >= 0x90 && c <= 0x9f:
		w.i++
		return uint64(c & 0x0f), true
	case c == 0xdc:
		n := binary.BigEndian.Uint16(w.b[w.i+1:])
		w.i += 3
		return uint64(n), true
	case c == 0xdd:
		n := binary.BigEndian.Uint32(w.b[w.i+1:])
		w.i += 5
		return uint64(n), true
	}
	return 0, false
}

// str reads a string; when the next value is not a string it is skipped
// and ok is false.
func (w *walker) str() (string, bool) {
	c := w.b[w.i]
	var n, hdr int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n, hdr = int(c&0x1f), 1
	case c == 0xd9:
		n, hdr = int(w.b[w.i+1]), 2
	case c == 0xda:
		n, hdr = int(binary.BigEndian.Uint16(w.b[w.i+1:])), 3
	case c == 0xdb:
		n, hdr = int(binary.BigEndian.Uint32(w.b[w.i+1:])), 5
	default:
		w.skip()
		return "", false
	}
	s := string(w.b[w.i+hdr : w.i+hdr+n])
	w.i += hdr + n
	return s, true
}

// skip steps over one whole value.
func (w *walker) skip() {
	for pending := uint64(1); pending > 0; pending-- {
		c := w.b[w.i]
		w.i++
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			pending += 2 * uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			pending += uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			w.i += int(c & 0x1f)
		default:
			size, k, extra, _ := describe(c)
			var n uint64
			switch size {
			case 1:
				n = uint64(w.b[w.i])
			case 2:
				n = uint64(binary.BigEndian.Uint16(w.b[w.i:]))
			case 4:
				n = uint64(binary.BigEndian.Uint32(w.b[w.i:]))
			}
			w.i += size
			switch k {
			case scalar:
				w.i += int(extra)
			case bytes:
				w.i += int(n + extra)
			case array:
				pending += n
			case object:
				pending += 2 * n
			}
		}
	}
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

func cachedFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := Fields(t)
	fieldCache.Store(t, f)
	return f
}

// Fields maps the msgpack names of a struct type's fields, those of inline
// embedded structs included, to their types, as the msgpack decoder names
// them.
func Fields(typ reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		tag := f.Tag.Get("msgpack")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range Fields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
