//go:build !(linux || darwin)

package verbs

// System reports that this system has no verbs library.
func System() (Provider, error) { return nil, ErrUnsupported }

// LibraryPath is the library System would load.
func LibraryPath() string { return "" }
