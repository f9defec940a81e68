package kvtransfer

import (
	"encoding/binary"
	"fmt"
)

// scanMsgpack checks that every length a msgpack document declares fits in
// the bytes that follow it, before the document is decoded. msgpack v5.4.1
// preallocates a slice to whatever element count the data declares, so
// without this check a few bytes from an unauthenticated peer (a HELLO is
// decoded before its proof is checked) could demand gigabytes. Every value
// takes at least one byte, so a container of n values needs n more bytes.
func scanMsgpack(b []byte) error {
	pending := 1 // values still to read
	for pending > 0 {
		if pending > len(b) {
			return fmt.Errorf("msgpack declares %d more values in %d bytes", pending, len(b))
		}
		pending--
		c := b[0]
		b = b[1:]
		var n int // bytes of data after the type byte and length
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixint, nil, bool
		case c >= 0x80 && c <= 0x8f: // fixmap
			pending += 2 * int(c&0x0f)
		case c >= 0x90 && c <= 0x9f: // fixarray
			pending += int(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf: // fixstr
			n = int(c & 0x1f)
		default:
			size, count, ext, ok := msgpackLength(c)
			if !ok {
				return fmt.Errorf("msgpack type byte 0x%02x is not valid", c)
			}
			if len(b) < size {
				return fmt.Errorf("msgpack truncated in a length")
			}
			var l uint64
			switch size {
			case 1:
				l = uint64(b[0])
			case 2:
				l = uint64(binary.BigEndian.Uint16(b))
			case 4:
				l = uint64(binary.BigEndian.Uint32(b))
			}
			b = b[size:]
			switch {
			case count == 0: // a fixed-size scalar or fixext
				n = ext
			case count == 1: // str, bin, ext: l bytes (+ the ext type byte)
				if l > uint64(len(b)) {
					return fmt.Errorf("msgpack declares %d bytes in %d", l, len(b))
				}
				n = int(l) + ext
			default: // array (1 value per element) or map (2)
				if l > uint64(len(b)) {
					return fmt.Errorf("msgpack declares %d elements in %d bytes", l, len(b))
				}
				pending += int(l) * (count - 1)
			}
		}
		if n > len(b) {
			return fmt.Errorf("msgpack declares %d bytes in %d", n, len(b))
		}
		b = b[n:]
	}
	return nil
}

// msgpackLength describes a non-fixed type byte: the size of its length
// field (0 for fixed-size types), count 0 for a scalar of ext bytes, 1 for
// a byte string (ext: extra bytes after it), 2 for an array, 3 for a map.
func msgpackLength(c byte) (size, count, ext int, ok bool) {
	switch c {
	case 0xc4, 0xd9: // bin8, str8
		return 1, 1, 0, true
	case 0xc5, 0xda:
		return 2, 1, 0, true
	case 0xc6, 0xdb:
		return 4, 1, 0, true
	case 0xc7: // ext8, ext16, ext32: length then a type byte
		return 1, 1, 1, true
	case 0xc8:
		return 2, 1, 1, true
	case 0xc9:
		return 4, 1, 1, true
	case 0xcc, 0xd0:
		return 0, 0, 1, true
	case 0xcd, 0xd1:
		return 0, 0, 2, true
	case 0xca, 0xce, 0xd2:
		return 0, 0, 4, true
	case 0xcb, 0xcf, 0xd3:
		return 0, 0, 8, true
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 (+ type byte)
		return 0, 0, 1 + 1<<(c-0xd4), true
	case 0xdc:
		return 2, 2, 0, true
	case 0xdd:
		return 4, 2, 0, true
	case 0xde:
		return 2, 3, 0, true
	case 0xdf:
		return 4, 3, 0, true
	}
	return 0, 0, 0, false
}
