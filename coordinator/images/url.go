package images

import (
	"context"
	"encoding/base64"
	"strings"

	"github.com/tandem-inference/tandem/media"
)

// mediaTypes are the data: URL media types accepted, and the format
// (media.Info.Format) each declares.
var mediaTypes = map[string]string{
	"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/gif": "gif", "image/webp": "webp",
}

// Reader reads the images of OpenAI image_url parts: data: URLs always,
// http(s) URLs through Fetch when it is set (the operator allowed it).
type Reader struct {
	Limits Limits
	Fetch  *Fetcher // nil: http(s) URLs are refused
}

// Read returns the encoded image an image_url names; i is its place
// among the request's images, for errors. A data: URL must be base64 and
// of an image type tandem reads (png, jpeg, gif, webp), and its bytes of
// that type.
func (r *Reader) Read(ctx context.Context, i int, url string) ([]byte, error) {
	lim := r.Limits.OrDefault()
	switch {
	case hasPrefixFold(url, "data:"):
		return dataURL(i, url, lim)
	case hasPrefixFold(url, "http://") || hasPrefixFold(url, "https://"):
		if r.Fetch == nil {
			return nil, refuse(i, false, "image URLs are not fetched here (the operator has not enabled http.images.fetch): send the image inline as a data: URL (data:image/png;base64,...)")
		}
		return r.Fetch.Get(ctx, i, url)
	case url == "":
		return nil, refuse(i, false, "image_url.url is empty: want a data: URL (data:image/png;base64,...)")
	}
	return nil, refuse(i, false, "image_url.url %q is neither a data: URL nor http(s)", clip(url))
}

// dataURL decodes data:<type>;base64,<data>, refusing a body over the
// limit before decoding it.
func dataURL(i int, url string, lim Limits) ([]byte, error) {
	head, payload, ok := strings.Cut(url[len("data:"):], ",")
	if !ok {
		return nil, refuse(i, false, "the data: URL has no comma before its data")
	}
	params := strings.Split(head, ";")
	mt := strings.ToLower(strings.TrimSpace(params[0]))
	base64Encoded := false
	for _, p := range params[1:] {
		if strings.EqualFold(strings.TrimSpace(p), "base64") {
			base64Encoded = true
		}
	}
	format, known := mediaTypes[mt]
	switch {
	case !known:
		return nil, refuse(i, false, "the data: URL's media type is %q: send image/png, image/jpeg, image/gif or image/webp", clip(mt))
	case !base64Encoded:
		return nil, refuse(i, false, "the data: URL is not base64: write data:%s;base64,...", mt)
	case int64(base64.StdEncoding.DecodedLen(len(payload))) > lim.Bytes+3:
		return nil, refuse(i, true, "is about %d bytes, at most %d allowed (images.bytes)", base64.StdEncoding.DecodedLen(len(payload)), lim.Bytes)
	}
	enc := base64.StdEncoding
	if !strings.HasSuffix(payload, "=") && len(payload)%4 != 0 {
		enc = base64.RawStdEncoding // padding left out, as some clients do
	}
	data, err := enc.DecodeString(payload)
	if err != nil {
		return nil, refuse(i, false, "the data: URL's base64 is malformed: %v", err)
	}
	if int64(len(data)) > lim.Bytes {
		return nil, refuse(i, true, "is %d bytes, at most %d allowed (images.bytes)", len(data), lim.Bytes)
	}
	// The type the URL declares must be the file's: a mislabelled file is
	// more likely a client's mistake than an image.
	if info, err := media.Probe(data, media.Limits{MaxBytes: lim.Bytes, MaxPixels: 1 << 62}); err == nil && info.Format != format {
		return nil, refuse(i, false, "the data: URL says %s, but the data is a %s image", mt, strings.ToUpper(info.Format))
	}
	return data, nil
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// clip shortens a client's string quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
