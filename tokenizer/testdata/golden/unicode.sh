#!/usr/bin/env bash
# Regenerates ../../unicode_update.go, the character classes in which the
# reference tokenizer follows newer Unicode tables than Go's, and the golden
# inputs that exercise them; then regenerates the goldens. Run it when Go or
# the pinned tiktoken package changes Unicode version.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd ../.. && go test -count=1 -run '^TestClassTable$' . -args -dump-base-classes "$tmp/go-classes.bin" >/dev/null)
node unicode.cjs "$tmp/go-classes.bin"
gofmt -w ../../unicode_update.go
./generate.sh
