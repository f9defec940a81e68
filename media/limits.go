package media

// Limits bound what one image may cost before it is decoded. A field left
// at zero (or negative) takes its DefaultLimits value.
type Limits struct {
	MaxBytes  int64 // encoded bytes per image
	MaxPixels int64 // decoded width*height per image, before resizing
}

// DefaultLimits allows 20 MiB files of up to 64 Mi pixels (8192x8192).
func DefaultLimits() Limits {
	return Limits{MaxBytes: 20 << 20, MaxPixels: 64 << 20}
}

func (l Limits) orDefault() Limits {
	d := DefaultLimits()
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxPixels <= 0 {
		l.MaxPixels = d.MaxPixels
	}
	return l
}
