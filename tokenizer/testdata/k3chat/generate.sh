#!/usr/bin/env bash
# Regenerates expected.json: render.py runs the released renderer (give the
# path of encoding_k3.py), encode.cjs adds the ids with npm tiktoken for the
# synthetic tokenizer the test loads (163,840 ids, the released size, written by WriteSynthetic).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -eq 1 ] || { echo "usage: $0 PATH/TO/encoding_k3.py" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$here" && python3 render.py "$1" > "$tmp/segments.json")
(cd "$here/../../.." && go run ./bench tokenize --write-synthetic "$tmp/tok" --vocab 163840 >/dev/null)
NODE_PATH="$here/../golden/node_modules" node "$here/encode.cjs" "$tmp/segments.json" "$tmp/tok" > "$here/expected.json"
echo "wrote $here/expected.json"
