package media

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"

	"golang.org/x/image/webp"
)

// Info is what Probe learns from an image's header.
type Info struct {
	Format        string // "png", "jpeg", "gif" or "webp"
	Width, Height int    // after EXIF orientation
}

// header is Probe's result with what Decode needs besides Info.
type header struct {
	Info
	rawW, rawH  int // as stored, before orientation
	orientation int // EXIF orientation 1..8 (1: as stored)
	png         pngHeader
}

// pngHeader holds the IHDR fields and tRNS presence that decide how Pillow
// reads a PNG (its mode), which the decoded image.Image does not keep.
type pngHeader struct {
	bitDepth, colorType byte
	hasTRNS             bool
	trnsGray            uint16 // the greyscale key, for colour type 0
	orientation         int    // from an eXIf chunk; 0 when none
}

// Probe reads only the header (the format's DecodeConfig and, for JPEG, the
// EXIF orientation), checks lim, and never allocates by the header's size.
func Probe(data []byte, lim Limits) (Info, error) {
	h, err := probe(data, lim)
	return h.Info, err
}

func probe(data []byte, lim Limits) (header, error) {
	var h header
	lim = lim.orDefault()
	if int64(len(data)) > lim.MaxBytes {
		return h, fmt.Errorf("media: image is %d bytes, over the limit of %d bytes (Limits.MaxBytes); send a smaller file", len(data), lim.MaxBytes)
	}
	format, decodeConfig := sniff(data)
	if format == "" {
		return h, fmt.Errorf("media: unrecognised image format (first bytes % x): send PNG, JPEG, GIF or WebP", data[:min(len(data), 8)])
	}
	cfg, err := decodeConfig(bytes.NewReader(data))
	if err != nil {
		return h, fmt.Errorf("media: reading the %s header: %w", format, eofError(err))
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return h, fmt.Errorf("media: %s header says the image is %dx%d: an image needs at least one pixel", format, cfg.Width, cfg.Height)
	}
	if int64(cfg.Width) > lim.MaxPixels || int64(cfg.Height) > lim.MaxPixels ||
		int64(cfg.Width)*int64(cfg.Height) > lim.MaxPixels {
		return h, fmt.Errorf("media: %s header says the image is %dx%d = %d pixels, over the limit of %d pixels (Limits.MaxPixels); send a smaller image",
			format, cfg.Width, cfg.Height, int64(cfg.Width)*int64(cfg.Height), lim.MaxPixels)
	}
	h.Format, h.rawW, h.rawH, h.orientation = format, cfg.Width, cfg.Height, 1
	switch format {
	case "jpeg":
		h.orientation = jpegOrientation(data)
	case "png":
		h.png = readPNGHeader(data)
		h.orientation = max(h.png.orientation, 1)
	case "webp":
		if err := checkWebP(data, h.rawW, h.rawH); err != nil {
			return h, err
		}
		h.orientation = webpOrientation(data)
	}
	h.Width, h.Height = h.rawW, h.rawH
	if h.orientation >= 5 { // the transposing orientations swap the sides
		h.Width, h.Height = h.rawH, h.rawW
	}
	return h, nil
}

type configFunc func(io.Reader) (image.Config, error)

// sniff names the format by its magic bytes; the image package's registry is
// not used so that only these four formats are ever parsed.
func sniff(data []byte) (string, configFunc) {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return "png", png.DecodeConfig
	case bytes.HasPrefix(data, []byte("\xff\xd8")):
		return "jpeg", jpeg.DecodeConfig
	case bytes.HasPrefix(data, []byte("GIF87a")) || bytes.HasPrefix(data, []byte("GIF89a")):
		return "gif", gif.DecodeConfig
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return "webp", webp.DecodeConfig
	}
	return "", nil
}

// eofError says "truncated" for the decoders' bare EOF errors.
func eofError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the file is truncated (%w)", err)
	}
	return err
}

// readPNGHeader reads IHDR's bit depth and colour type, whether a tRNS
// chunk comes before the image data, and the orientation in an eXIf chunk
// (which Pillow reads wherever it is). The walk advances at least 12 bytes a
// chunk and stops at the end of data, so hostile lengths cannot loop.
func readPNGHeader(data []byte) pngHeader {
	var p pngHeader
	if len(data) < 33 || string(data[12:16]) != "IHDR" {
		return p
	}
	p.bitDepth, p.colorType = data[24], data[25]
	idat := false
	for off := 8; off+8 <= len(data); {
		n := int64(binary.BigEndian.Uint32(data[off:]))
		typ := string(data[off+4 : off+8])
		if typ == "IEND" {
			break
		}
		next := int64(off) + 12 + n
		if next > int64(len(data)) {
			break
		}
		if typ == "IDAT" {
			idat = true
		}
		if typ == "eXIf" && p.orientation == 0 {
			p.orientation = exifOrientation(data[off+8 : off+8+int(n)])
		}
		if typ == "tRNS" && !idat {
			p.hasTRNS = true
			if n >= 2 {
				p.trnsGray = binary.BigEndian.Uint16(data[off+8:])
			}
		}
		off = int(next)
	}
	return p
}
