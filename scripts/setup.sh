#!/usr/bin/env bash
# Installs everything tandem's tests need on a fresh machine, pinned, from
# the Go module proxy and the npm registry: Go modules, nats-server and the
# nats CLI (into ./bin), the npm tiktoken package the tokenizer's golden
# check compares against, the npm openai package and curl that the HTTP API's
# tests drive it with. Idempotent; quiet when everything is present.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

command -v go >/dev/null || { echo "setup: Go 1.26 is required (https://go.dev/dl)" >&2; exit 1; }
go mod download
"$root/scripts/install-nats.sh"
if ! command -v curl >/dev/null; then
	if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
		apt-get update -qq >/dev/null && apt-get install -y -qq curl >/dev/null
	else
		echo "setup: curl not found; the HTTP API's raw event-stream checks will be skipped" >&2
	fi
fi
# The verbs binding's layout test (kvtransfer/rdma/sysverbs) compares its
# mirrored structs with <infiniband/verbs.h>; gcc compiles the check at test
# time only. Debian 12's rdma-core; without it the test skips.
if [ ! -f /usr/include/infiniband/verbs.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
	echo "setup: installing libibverbs-dev 44.0-2 (header for the verbs layout test)" >&2
	if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libibverbs-dev=44.0-2 >/dev/null; }; then
		echo "setup: libibverbs-dev 44.0-2 not installable here; the verbs layout test will be skipped" >&2
	fi
fi
if command -v npm >/dev/null; then
	"$root/tokenizer/testdata/golden/setup.sh"
	"$root/coordinator/openai/testdata/client/setup.sh"
else
	echo "setup: npm not found; the tokenizer's live comparison with npm tiktoken will be skipped (the committed goldens are still checked)" >&2
fi
# qemu-user runs the arm64 (decode worker) tests on an amd64 machine; from
# Debian's qemu-user-static, through apt-get when it is there.
if ! command -v qemu-aarch64-static >/dev/null; then
	if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
	else
		echo "setup: qemu-aarch64-static not found and apt-get is unavailable (or not root): the arm64 tests will be skipped" >&2
	fi
fi
# clang-19 compiles the CUDA kernels (kernels/cuda/src) to the committed PTX;
# test.sh regenerates it and compares, and the kernels' emulator tests build
# with its clang++ where no g++ exists. Pinned: other versions emit other PTX.
clang_pin="1:19.1.7-3~deb12u1"
if ! clang-19 --version 2>/dev/null | grep -q 'clang version 19\.1\.7'; then
	if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "clang-19=$clang_pin" >/dev/null
	else
		echo "setup: clang-19 ($clang_pin) not found and apt-get is unavailable (or not root): the committed PTX cannot be checked against its sources" >&2
	fi
fi
# media's comparison with Pillow (TestAgainstPillow) runs Debian's python3
# with its python3-pil, the Pillow the reference preprocessing is pinned to.
pil_pin="9.4.0-1.1+deb12u1"
if ! /usr/bin/python3 -c 'import PIL, sys; sys.exit(PIL.__version__ != "9.4.0")' 2>/dev/null; then
	if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
		echo "setup: installing python3-pil $pil_pin (media's comparison with Pillow)" >&2
		if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "python3-pil=$pil_pin" >/dev/null; }; then
			echo "setup: python3-pil $pil_pin not installable here; media's comparison with Pillow will be skipped" >&2
		fi
	else
		echo "setup: Pillow 9.4.0 (python3-pil $pil_pin) not found and apt-get is unavailable (or not root): media's comparison with Pillow will be skipped" >&2
	fi
fi
