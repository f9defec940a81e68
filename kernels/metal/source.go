package metal

import (
	"embed"
	"sort"
	"strings"

	"github.com/tandem-inference/tandem/kernels/internal/kernelsrc"
)

//go:embed src/*.metal
var sources embed.FS

// Source is the library the device compiles: prelude.metal with the
// shared numerics in place of its #include, then every kernel file without
// its #include of the prelude (newLibraryWithSource has no file system).
func Source() string {
	var b strings.Builder
	pre, err := sources.ReadFile("src/prelude.metal")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	b.WriteString(inline(string(pre)))
	names, _ := sources.ReadDir("src")
	var files []string
	for _, e := range names {
		if e.Name() != "prelude.metal" {
			files = append(files, e.Name())
		}
	}
	sort.Strings(files)
	for _, f := range files {
		src, err := sources.ReadFile("src/" + f)
		if err != nil {
			panic(err)
		}
		b.WriteString("\n// ---- " + f + "\n")
		b.WriteString(inline(string(src)))
	}
	return b.String()
}

// inline drops #pragma once and the prelude's #include, and replaces the
// numerics #include with the file. Lines inside #ifdef METALEMU stay: the
// device compiler skips them.
func inline(src string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(src, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == "#pragma once", t == `#include "prelude.metal"`:
			continue
		case t == `#include "../../internal/kernelsrc/numerics.h"`:
			b.WriteString(inline(kernelsrc.Numerics))
			b.WriteString("\n")
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}
