package controlplane

import (
	"encoding/binary"
	"fmt"
)

// maxMsgpackDepth bounds container nesting; no message nests deeper than a
// few levels.
const maxMsgpackDepth = 32

// scanMsgpack checks the structure of one msgpack value before it is
// decoded: every length fits in the bytes that follow, nesting is bounded,
// and nothing trails the value. The msgpack library allocates a slice of the
// length a header declares (up to 4 G elements), so without this check a
// 10-byte message could make a server allocate gigabytes.
func scanMsgpack(b []byte) error {
	i := 0
	// need skips n bytes of payload at i.
	need := func(n uint64) error {
		if n > uint64(len(b)-i) {
			return fmt.Errorf("malformed msgpack at byte %d: a length of %d overruns the %d bytes left", i, n, len(b)-i)
		}
		i += int(n)
		return nil
	}
	// length reads a big-endian length of size bytes.
	length := func(size int) (uint64, error) {
		if size > len(b)-i {
			return 0, fmt.Errorf("malformed msgpack at byte %d: truncated length", i)
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
		return n, nil
	}
	stack := []uint64{1} // values still to read at each nesting level
	open := func(items uint64) error {
		// Every item takes at least one byte.
		if items > uint64(len(b)-i) {
			return fmt.Errorf("malformed msgpack at byte %d: a container of %d items overruns the %d bytes left", i, items, len(b)-i)
		}
		if len(stack) >= maxMsgpackDepth {
			return fmt.Errorf("malformed msgpack at byte %d: nested deeper than %d", i, maxMsgpackDepth)
		}
		stack = append(stack, items)
		return nil
	}
	// payload reads a length of size bytes, then skips extra+length bytes.
	payload := func(size int, extra uint64) error {
		n, err := length(size)
		if err != nil {
			return err
		}
		return need(n + extra)
	}
	// container reads a length of size bytes and opens per*length items.
	container := func(size int, per uint64) error {
		n, err := length(size)
		if err != nil {
			return err
		}
		return open(per * n)
	}
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
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			// fixint, nil, bool: no payload
		case c >= 0x80 && c <= 0x8f:
			err = open(2 * uint64(c&0x0f))
		case c >= 0x90 && c <= 0x9f:
			err = open(uint64(c & 0x0f))
		case c >= 0xa0 && c <= 0xbf:
			err = need(uint64(c & 0x1f))
		case c == 0xc4 || c == 0xd9: // bin8, str8
			err = payload(1, 0)
		case c == 0xc5 || c == 0xda: // bin16, str16
			err = payload(2, 0)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			err = payload(4, 0)
		case c == 0xc7: // ext8: length, type byte, data
			err = payload(1, 1)
		case c == 0xc8:
			err = payload(2, 1)
		case c == 0xc9:
			err = payload(4, 1)
		case c == 0xca || c == 0xce || c == 0xd2:
			err = need(4)
		case c == 0xcb || c == 0xcf || c == 0xd3:
			err = need(8)
		case c == 0xcc || c == 0xd0:
			err = need(1)
		case c == 0xcd || c == 0xd1:
			err = need(2)
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 plus the type byte
			err = need(1 + 1<<(c-0xd4))
		case c == 0xdc:
			err = container(2, 1)
		case c == 0xdd:
			err = container(4, 1)
		case c == 0xde: // map16: keys and values
			err = container(2, 2)
		case c == 0xdf:
			err = container(4, 2)
		default: // 0xc1 is never used
			err = fmt.Errorf("malformed msgpack at byte %d: code 0x%02x is not msgpack", i-1, c)
		}
		if err != nil {
			return err
		}
	}
	if i != len(b) {
		return fmt.Errorf("%d trailing bytes after the map", len(b)-i)
	}
	return nil
}
