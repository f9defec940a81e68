// Package msgpackscan checks the structure of an untrusted msgpack value
// before it is decoded.
//
// msgpack v5 preallocates a slice of whatever length a header declares (up
// to 4 G elements), and decodes nested containers recursively. Without a
// check, a few bytes from an unauthenticated peer could make a server
// allocate gigabytes or recurse without bound. Check verifies that every
// declared length fits in the bytes that follow (every value takes at least
// one byte), that nesting stays within a bound, and that exactly one value
// fills the input.
package msgpackscan

import (
	"encoding/binary"
	"fmt"
)

// MaxDepth bounds container nesting; tandem's messages nest a few levels.
const MaxDepth = 32

// Check validates one msgpack value in b.
func Check(b []byte) error {
	i := 0
	stack := []uint64{1} // values still to read at each nesting level
	for len(stack) > 0 {
		top := len(stack) - 1
		if stack[top] == 0 {
			stack = stack[:top]
			continue
		}
		stack[top]--
		if i >= len(b) {
			return fmt.Errorf("malformed msgpack: input ends at byte %d in the middle of a value", i)
		}
		c := b[i]
		i++
		var skip uint64 // payload bytes after the type byte and its length
		var items uint64
		container := false
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixint, nil, bool
		case c >= 0x80 && c <= 0x8f: // fixmap: keys and values
			items, container = 2*uint64(c&0x0f), true
		case c >= 0x90 && c <= 0x9f: // fixarray
			items, container = uint64(c&0x0f), true
		case c >= 0xa0 && c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		default:
			size, kind, extra, ok := describe(c)
			if !ok {
				return fmt.Errorf("malformed msgpack at byte %d: code 0x%02x is not msgpack", i-1, c)
			}
			if size > len(b)-i {
				return fmt.Errorf("malformed msgpack at byte %d: truncated length", i)
			}
			var n uint64
			switch size {
			case 1:
				n = uint64(b[i])
			case 2:
				n = uint64(binary.BigEndian.Uint16(b[i:]))
			case 4:
				n = uint64(binary.BigEndian.Uint32(b[i:]))
			}
			i += size
			switch kind {
			case scalar:
				skip = extra
			case bytes:
				skip = n + extra
			case array:
				items, container = n, true
			case object:
				items, container = 2*n, true
			}
		}
		if container {
			if items > uint64(len(b)-i) {
				return fmt.Errorf("malformed msgpack at byte %d: a container of %d items overruns the %d bytes left", i, items, len(b)-i)
			}
			if len(stack) > MaxDepth {
				return fmt.Errorf("malformed msgpack at byte %d: nested deeper than %d", i, MaxDepth)
			}
			stack = append(stack, items)
			continue
		}
		if skip > uint64(len(b)-i) {
			return fmt.Errorf("malformed msgpack at byte %d: a length of %d overruns the %d bytes left", i, skip, len(b)-i)
		}
		i += int(skip)
	}
	if i != len(b) {
		return fmt.Errorf("malformed msgpack: %d trailing bytes after the value", len(b)-i)
	}
	return nil
}

type kind uint8

const (
	scalar kind = iota // fixed size: extra bytes
	bytes              // str, bin, ext: length bytes (+ extra: ext's type byte)
	array
	object // map
)

// describe gives a non-fixed type byte's length-field size, kind and extra
// payload bytes.
func describe(c byte) (size int, k kind, extra uint64, ok bool) {
	switch c {
	case 0xc4, 0xd9: // bin8, str8
		return 1, bytes, 0, true
	case 0xc5, 0xda:
		return 2, bytes, 0, true
	case 0xc6, 0xdb:
		return 4, bytes, 0, true
	case 0xc7: // ext8, ext16, ext32: length, then a type byte
		return 1, bytes, 1, true
	case 0xc8:
		return 2, bytes, 1, true
	case 0xc9:
		return 4, bytes, 1, true
	case 0xcc, 0xd0:
		return 0, scalar, 1, true
	case 0xcd, 0xd1:
		return 0, scalar, 2, true
	case 0xca, 0xce, 0xd2:
		return 0, scalar, 4, true
	case 0xcb, 0xcf, 0xd3:
		return 0, scalar, 8, true
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 (+ type byte)
		return 0, scalar, 1 + 1<<(c-0xd4), true
	case 0xdc:
		return 2, array, 0, true
	case 0xdd:
		return 4, array, 0, true
	case 0xde:
		return 2, object, 0, true
	case 0xdf:
		return 4, object, 0, true
	}
	return 0, 0, 0, false
}
