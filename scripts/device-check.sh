#!/usr/bin/env bash
# device-check.sh: run tandem's GPU checks on a machine that has an NVIDIA GPU
# but maybe no network, no Go and no module cache.
#
#   scripts/device-check.sh build [DIR]   on the development machine: every
#       package's test binary and bench, for linux/amd64, CGO_ENABLED=0,
#       stripped, into DIR (default device-check/), with each package's
#       testdata, and this script. Copy DIR to the GPU machine.
#   DIR/device-check.sh run [DIR]         on the GPU machine: the CUDA
#       backend's tests (the conformance suite on the device), the backend
#       flag of the prefill worker, then `bench validate --backend cuda`;
#       the report lands in DIR/report (validate.md, .json, .png). Each step
#       has a time limit; the whole run stays under 8 minutes.
#   DIR/device-check.sh run-all [DIR]     every test binary with -test.short
#       (longer; tests that need nats-server or go skip or fail there).
set -euo pipefail

cmd=${1:-}
dir=${2:-device-check}

case "$cmd" in
build)
	root=$(cd "$(dirname "$0")/.." && pwd)
	mkdir -p "$dir/tests" "$dir/pkgs"
	dir=$(cd "$dir" && pwd)
	cd "$root"
	export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
	go build -trimpath -ldflags='-s -w' -o "$dir/bench" ./bench
	for pkg in $(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do
		rel=${pkg#github.com/tandem-inference/tandem}
		rel=${rel#/}
		name=${rel//\//_}
		name=${name:-root}
		go test -c -trimpath -ldflags='-s -w' -o "$dir/tests/$name.test" "./$rel"
		mkdir -p "$dir/pkgs/$rel"
		if [ -d "$rel/testdata" ]; then cp -r "$rel/testdata" "$dir/pkgs/$rel/"; fi
		echo "$name $rel" >>"$dir/tests/index.new"
	done
	mv "$dir/tests/index.new" "$dir/tests/index"
	cp "$0" "$dir/device-check.sh"
	chmod +x "$dir/device-check.sh"
	echo "built $(wc -l <"$dir/tests/index") test binaries and bench in $dir ($(du -sh "$dir" | cut -f1)); copy it to the GPU machine and run: $(basename "$dir")/device-check.sh run"
	;;
run | run-all)
	dir=$(cd "$dir" && pwd)
	[ -f "$dir/tests/index" ] || { echo "device-check: $dir/tests/index missing: run 'scripts/device-check.sh build $dir' first" >&2; exit 2; }
	export TANDEM_TEST_CACHE="$dir/cache"
	mkdir -p "$TANDEM_TEST_CACHE" "$dir/report"
	nvidia-smi -L 2>/dev/null || echo "device-check: nvidia-smi not found (the driver may still load)"
	status=0
	# run_test NAME LIMIT [ARGS...]: one package's tests in its own directory.
	run_test() {
		local name=$1 limit=$2
		shift 2
		local rel
		rel=$(awk -v n="$name" '$1 == n {print $2}' "$dir/tests/index")
		echo "== $rel ($limit s)"
		if ! (cd "$dir/pkgs/$rel" && timeout "$limit" "$dir/tests/$name.test" -test.timeout "${limit}s" "$@" 2>&1 | tail -n 60); then
			echo "device-check: $rel FAILED"
			status=1
		fi
	}
	if [ "$cmd" = run-all ]; then
		while read -r name rel; do run_test "$name" 600 -test.short; done <"$dir/tests/index"
	else
		run_test kernels_cuda 180 -test.v -test.run 'TestConformance|TestOpenWithoutDriver|TestPlanGroups|TestMemcpy2DLayout'
		run_test prefill-worker 60 -test.run 'TestCUDABackendWithoutDriver|TestConfig'
		echo "== bench validate (240 s)"
		if ! timeout 240 "$dir/bench" validate --backend cuda --out "$dir/report"; then
			echo "device-check: bench validate FAILED"
			status=1
		fi
	fi
	echo "device-check: report in $dir/report; status $status"
	exit $status
	;;
*)
	sed -n '2,18p' "$0" >&2
	exit 2
	;;
esac
