// Package images is the coordinator's side of image inputs: the limits a
// request's images are held to, reading them from OpenAI's image_url
// parts (data: URLs, and http(s) URLs when the operator allows fetching),
// and what the prompt needs of each (its size for K3's media marker and its
// number of feature rows). Hostile files are refused by their header
// (media.Probe) before anything is allocated by what the header says.
package images

import (
	"errors"
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/media"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Limits bound a request's images. Zero fields take DefaultLimits' values.
type Limits struct {
	PerRequest int   // images in one request
	Bytes      int64 // encoded bytes of one image
	TotalBytes int64 // encoded bytes of a request's images together
	Pixels     int64 // width x height of one image, before resizing
}

// DefaultLimits: 8 images of at most 5 MiB and 64 Mi pixels each, 6 MiB in
// all. A job carries its images in its NATS messages, so TotalBytes must
// stay under the NATS server's max_payload (the embedded server's default
// is 8 MiB) with room for the prompt.
func DefaultLimits() Limits {
	return Limits{PerRequest: 8, Bytes: 5 << 20, TotalBytes: 6 << 20, Pixels: media.DefaultLimits().MaxPixels}
}

// OrDefault returns l with its zero fields set to the defaults.
func (l Limits) OrDefault() Limits {
	d := DefaultLimits()
	if l.PerRequest <= 0 {
		l.PerRequest = d.PerRequest
	}
	if l.Bytes <= 0 {
		l.Bytes = d.Bytes
	}
	if l.TotalBytes <= 0 {
		l.TotalBytes = d.TotalBytes
	}
	if l.Pixels <= 0 {
		l.Pixels = d.Pixels
	}
	return l
}

// Error is a refused image: TooLarge for one over a limit (HTTP 413), else
// a malformed or undecodable one (400). Index is the image's place among
// the request's images (-1: the request's images together).
type Error struct {
	Index    int
	TooLarge bool
	Msg      string
}

func (e *Error) Error() string {
	if e.Index < 0 {
		return "images: " + e.Msg
	}
	return fmt.Sprintf("image #%d: %s", e.Index+1, e.Msg)
}

// IsTooLarge reports whether err is an image over a limit.
func IsTooLarge(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.TooLarge
}

func refuse(i int, tooLarge bool, format string, args ...any) *Error {
	return &Error{Index: i, TooLarge: tooLarge, Msg: fmt.Sprintf(format, args...)}
}

// CheckCount refuses more than PerRequest images, and more than
// TotalBytes of them together (sizes as they are known: call it before
// reading them where possible).
func (l Limits) CheckCount(n int, total int64) error {
	l = l.OrDefault()
	switch {
	case n > l.PerRequest:
		return refuse(-1, true, "the request has %d images, at most %d allowed (images.per_request)", n, l.PerRequest)
	case total > l.TotalBytes:
		return refuse(-1, true, "the request's images are %d bytes together, at most %d allowed (images.total_bytes)", total, l.TotalBytes)
	}
	return nil
}

// Size reads what the prompt needs of image i from its header alone
// (media.Probe and the scale rule, media.Plan): its size for the marker
// and its feature rows. A file over Bytes or Pixels is TooLarge; one that
// is not a PNG, JPEG, GIF or WebP image, or whose header is damaged, is
// not. Nothing is allocated by the header's size.
func (l Limits) Size(i int, data []byte) (tokenizer.ChatImage, error) {
	l = l.OrDefault()
	switch {
	case len(data) == 0:
		return tokenizer.ChatImage{}, refuse(i, false, "is empty: want a PNG, JPEG, GIF or WebP file")
	case int64(len(data)) > l.Bytes:
		return tokenizer.ChatImage{}, refuse(i, true, "is %d bytes, at most %d allowed (images.bytes)", len(data), l.Bytes)
	}
	// Probe checks the pixels against no limit of its own here, so that
	// an image over ours is told apart (413) from a damaged one (400).
	info, err := media.Probe(data, media.Limits{MaxBytes: l.Bytes, MaxPixels: math.MaxInt64})
	if err != nil {
		return tokenizer.ChatImage{}, refuse(i, false, "%v", err)
	}
	if px := int64(info.Width) * int64(info.Height); px > l.Pixels {
		return tokenizer.ChatImage{}, refuse(i, true, "is %dx%d = %d pixels, at most %d allowed (images.pixels)", info.Width, info.Height, px, l.Pixels)
	}
	_, _, gw, gh, err := media.Plan(info.Width, info.Height)
	if err != nil {
		return tokenizer.ChatImage{}, refuse(i, false, "%v", err)
	}
	return tokenizer.ChatImage{Width: info.Width, Height: info.Height, Rows: (gw / media.MergeSize) * (gh / media.MergeSize)}, nil
}

// Decode is Size, then decodes and preprocesses the whole image
// (media.Decode, within the limits) to make sure it is readable: a
// truncated or corrupt file is refused here rather than failing its job.
func (l Limits) Decode(i int, data []byte) (tokenizer.ChatImage, error) {
	ci, err := l.Size(i, data)
	if err != nil {
		return ci, err
	}
	l = l.OrDefault()
	im, err := media.Decode(data, media.Limits{MaxBytes: l.Bytes, MaxPixels: l.Pixels})
	if err != nil {
		return ci, refuse(i, false, "cannot be decoded: %v", err)
	}
	if im.Width != ci.Width || im.Height != ci.Height || im.Rows() != ci.Rows {
		return ci, refuse(i, false, "decodes to %dx%d with %d feature rows, its header says %dx%d with %d", im.Width, im.Height, im.Rows(), ci.Width, ci.Height, ci.Rows)
	}
	return ci, nil
}

// Sizes checks a request's images (count, bytes) and returns each one's
// size and rows: from the headers alone (Size), or, with decode, after
// decoding each (Decode).
func (l Limits) Sizes(imgs [][]byte, decode bool) ([]tokenizer.ChatImage, error) {
	var total int64
	for _, im := range imgs {
		total += int64(len(im))
	}
	if err := l.CheckCount(len(imgs), total); err != nil {
		return nil, err
	}
	out := make([]tokenizer.ChatImage, len(imgs))
	for i, data := range imgs {
		var err error
		if decode {
			out[i], err = l.Decode(i, data)
		} else {
			out[i], err = l.Size(i, data)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// CheckPadRuns checks a prompt given as token ids against its images: one
// run of pad ids per image, in order, each exactly as long as its image's
// feature rows, and no pad as the prompt's last token (the decode side
// runs that one alone).
func CheckPadRuns(ids []int32, pad int32, imgs []tokenizer.ChatImage) error {
	run := 0
	for i := 0; i < len(ids); {
		if ids[i] != pad {
			i++
			continue
		}
		j := i
		for j < len(ids) && ids[j] == pad {
			j++
		}
		switch {
		case run >= len(imgs):
			return refuse(-1, false, "the prompt holds more runs of <|media_pad|> (id %d) than the %d images given; the run at token %d has no image", pad, len(imgs), i)
		case j-i != imgs[run].Rows:
			return refuse(run, false, "has %d feature rows, the prompt holds %d pad tokens for it (at token %d)", imgs[run].Rows, j-i, i)
		case j == len(ids):
			return refuse(run, false, "its pad tokens end the prompt: the prompt must go on after an image (K3's marker ends with <|media_end|>)")
		}
		run++
		i = j
	}
	if run != len(imgs) {
		return refuse(-1, false, "%d images are given for %d runs of <|media_pad|> (id %d) in the prompt", len(imgs), run, pad)
	}
	return nil
}
