package media

// Limits bound what one image may cost before it is decoded.
type Limits struct {
	MaxBytes  int64 // encoded bytes per image
	MaxPixels int64 // decoded width*height per image, before resizing
}

// DefaultLimits allows 20 MiB files of up to 64 Mi pixels (8192x8192).
func DefaultLimits() Limits {
	return Limits{MaxBytes: 20 << 20, MaxPixels: 64 << 20}
}
