#!/usr/bin/env bash
# Installs the pinned NATS tools that tandem's integration tests and CI use:
#   nats-server (github.com/nats-io/nats-server/v2) and the nats CLI (natscli)
# into <repo>/bin with `go install`. Idempotent: a binary already built from
# the pinned module version is left alone. Needs only Go and the Go module
# proxy. Prints one line per tool it installs and nothing when all is present.
#
# Usage: scripts/install-nats.sh [--check]
#   --check  exit 1 (listing what is missing) instead of installing
set -euo pipefail

NATS_SERVER_MODULE=github.com/nats-io/nats-server/v2
NATS_SERVER_VERSION=v2.15.2
NATSCLI_MODULE=github.com/nats-io/natscli
NATSCLI_VERSION=v0.5.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/bin"

check_only=0
case "${1:-}" in
"") ;;
--check) check_only=1 ;;
*)
	echo "usage: $0 [--check]" >&2
	exit 2
	;;
esac

if ! command -v go >/dev/null 2>&1; then
	echo "install-nats: go is not on PATH; install Go 1.26 first" >&2
	exit 1
fi

# pinned BINARY MODULE VERSION: true when bin/BINARY was built from MODULE@VERSION.
# `go version -m` reads the build info Go embeds in every binary it builds.
pinned() {
	local exe="$bin/$1"
	[ -x "$exe" ] || return 1
	go version -m "$exe" 2>/dev/null | awk -v m="$2" -v v="$3" '
		$1 == "mod" && $2 == m && $3 == v { found = 1 }
		END { exit found ? 0 : 1 }'
}

# ensure BINARY MODULE PACKAGE VERSION
ensure() {
	local name=$1 module=$2 pkg=$3 version=$4
	if pinned "$name" "$module" "$version"; then
		return 0
	fi
	if [ "$check_only" = 1 ]; then
		echo "install-nats: $bin/$name is missing or not $module@$version" >&2
		return 1
	fi
	mkdir -p "$bin"
	# Outside any module (cd /) so the repository's go.mod and GOFLAGS such
	# as -mod=vendor cannot change what gets built; static, no cgo.
	local log
	log="$(mktemp)"
	if ! (cd / && GOBIN="$bin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
		go install "$pkg@$version") >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		echo "install-nats: go install $pkg@$version failed" >&2
		return 1
	fi
	rm -f "$log"
	if ! pinned "$name" "$module" "$version"; then
		echo "install-nats: $bin/$name was built but does not report $module@$version" >&2
		return 1
	fi
	echo "install-nats: installed $name $version into $bin"
}

status=0
ensure nats-server "$NATS_SERVER_MODULE" "$NATS_SERVER_MODULE" "$NATS_SERVER_VERSION" || status=1
ensure nats "$NATSCLI_MODULE" "$NATSCLI_MODULE/nats" "$NATSCLI_VERSION" || status=1
exit "$status"
