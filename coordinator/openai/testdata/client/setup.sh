#!/usr/bin/env bash
# Installs the pinned npm openai package that coordinator/openai's tests
# drive the API with. Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")"
version() { node -p "JSON.parse(require('fs').readFileSync('$1', 'utf8'))$2"; }
if [ -f node_modules/openai/package.json ] &&
	[ "$(version node_modules/openai/package.json .version)" = "$(version package.json '.dependencies.openai')" ]; then
	exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null
