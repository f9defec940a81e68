package media

import (
	"encoding/binary"
	"fmt"
)

// checkWebP closes a gap between a WebP's header and its decoder: an
// extended (VP8X) file states a canvas size, which DecodeConfig reports and
// Limits check, but the decoder allocates by the size in the VP8 or VP8L
// frame inside it. Probe therefore reads that frame's size too and refuses
// a file whose frame is not the canvas, and animated files, which the
// decoder cannot read. Chunks are walked by their declared sizes within
// data, each step at least 8 bytes.
func checkWebP(data []byte, w, h int) error {
	if len(data) < 16 || string(data[12:16]) != "VP8X" {
		return nil // simple formats: DecodeConfig read the frame's own size
	}
	if len(data) > 20 && data[20]&(1<<1) != 0 {
		return fmt.Errorf("media: animated WebP is not supported: send one frame as PNG, JPEG or a still WebP")
	}
	for off := 12; off+8 <= len(data); {
		n := int64(binary.LittleEndian.Uint32(data[off+4:]))
		body := data[off+8 : min(int64(off)+8+n, int64(len(data)))]
		fw, fh, ok := 0, 0, false
		switch string(data[off : off+4]) {
		case "VP8 ": // frame tag (3 bytes), start code 9d 01 2a, 14-bit sizes
			if len(body) >= 10 {
				fw = int(binary.LittleEndian.Uint16(body[6:]) & 0x3fff)
				fh = int(binary.LittleEndian.Uint16(body[8:]) & 0x3fff)
				ok = true
			}
		case "VP8L": // signature 0x2f, then 14-bit width-1 and height-1
			if len(body) >= 5 {
				bits := binary.LittleEndian.Uint32(body[1:])
				fw, fh, ok = int(bits&0x3fff)+1, int(bits>>14&0x3fff)+1, true
			}
		}
		if ok {
			if fw != w || fh != h {
				return fmt.Errorf("media: the webp canvas is %dx%d but its frame is %dx%d: the file is malformed", w, h, fw, fh)
			}
			return nil
		}
		off = int(int64(off) + 8 + n + n%2)
		if off < 0 {
			break
		}
	}
	return nil // no frame: the decoder reports the malformed file
}
