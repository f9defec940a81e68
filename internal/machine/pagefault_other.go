//go:build !unix

package machine

// PageFaultMicros is not measured here.
func PageFaultMicros() (us float64, ok bool) { return 0, false }
