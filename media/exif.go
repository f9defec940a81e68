package media

import "encoding/binary"

// jpegOrientation returns the EXIF orientation (1..8) from a JPEG's APP1
// segment, or 1 when there is none or it cannot be read. It walks the
// markers before the image data; each step advances at least two bytes and
// every read is bounds-checked, so hostile input can neither loop nor panic.
func jpegOrientation(data []byte) int {
	for off := 2; off+4 <= len(data); {
		if data[off] != 0xff {
			return 1
		}
		marker := data[off+1]
		switch {
		case marker == 0xff: // fill byte
			off++
			continue
		case marker == 0xd8 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7):
			off += 2 // markers without a length
			continue
		case marker == 0xda || marker == 0xd9: // image data or end: no EXIF after
			return 1
		}
		n := int(binary.BigEndian.Uint16(data[off+2:]))
		if n < 2 || off+2+n > len(data) {
			return 1
		}
		seg := data[off+4 : off+2+n]
		if marker == 0xe1 && len(seg) >= 6 && string(seg[:6]) == "Exif\x00\x00" {
			return max(tiffOrientation(seg[6:]), 1)
		}
		off += 2 + n
	}
	return 1
}

// tiffOrientation reads tag 0x0112 (Orientation, one SHORT) from the first
// IFD of a TIFF structure; 0 when absent or not in 1..8. Only IFD0 is read:
// no offsets are followed beyond it, so there is nothing to cycle through.
func tiffOrientation(t []byte) int {
	if len(t) < 8 {
		return 0
	}
	var bo binary.ByteOrder
	switch string(t[:2]) {
	case "II":
		bo = binary.LittleEndian
	case "MM":
		bo = binary.BigEndian
	default:
		return 0
	}
	if bo.Uint16(t[2:]) != 42 {
		return 0
	}
	ifd := int64(bo.Uint32(t[4:]))
	if ifd < 8 || ifd+2 > int64(len(t)) {
		return 0
	}
	count := int64(bo.Uint16(t[ifd:]))
	for i := int64(0); i < count; i++ {
		e := ifd + 2 + 12*i
		if e+12 > int64(len(t)) {
			return 0
		}
		if bo.Uint16(t[e:]) != 0x0112 {
			continue
		}
		var o int
		switch typ, n := bo.Uint16(t[e+2:]), bo.Uint32(t[e+4:]); {
		case n < 1:
			return 0
		case typ == 3: // SHORT, the type the standard gives the tag
			o = int(bo.Uint16(t[e+8:]))
		case typ == 4: // LONG, which Pillow also reads
			o = int(bo.Uint32(t[e+8:]))
		}
		if o >= 1 && o <= 8 {
			return o
		}
		return 0
	}
	return 0
}

// exifOrientation reads an EXIF payload that may or may not carry the
// "Exif\0\0" prefix (PNG's eXIf and WebP's EXIF chunks are seen both ways);
// 0 when there is no orientation.
func exifOrientation(b []byte) int {
	if len(b) >= 6 && string(b[:6]) == "Exif\x00\x00" {
		b = b[6:]
	}
	return tiffOrientation(b)
}

// webpOrientation reads the EXIF chunk of an extended (VP8X) WebP; 1 when
// there is none. Chunks are walked by their declared sizes, each step at
// least 8 bytes, within data.
func webpOrientation(data []byte) int {
	for off := 12; off+8 <= len(data); {
		n := int64(binary.LittleEndian.Uint32(data[off+4:]))
		end := int64(off) + 8 + n
		if end > int64(len(data)) {
			return 1
		}
		if string(data[off:off+4]) == "EXIF" {
			return max(exifOrientation(data[off+8:end]), 1)
		}
		off = int(end + n%2) // chunks are padded to an even size
	}
	return 1
}
