#!/usr/bin/env bash
# Installs the pinned npm tiktoken package that the golden generator and the
# live golden check use. Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/tiktoken/package.json ] &&
	[ "$(node -p 'require("./node_modules/tiktoken/package.json").version')" = "$(node -p 'require("./package.json").dependencies.tiktoken')" ]; then
	exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null
