#!/usr/bin/env bash
# Regenerates the committed golden files under expected/ from the npm
# tiktoken package. Run it after changing cases, the pattern or
# WriteSynthetic; then run go test ./tokenizer/.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
node generate.cjs --out expected "$@"
