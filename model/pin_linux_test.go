package model_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// TestPinKeepsTheWeightsInMemory: a pinned layer's weights are locked in
// memory (the process's VmLck grows by them; an unpinned load's does not,
// which shows the check can fail) and stay there when the kernel is asked
// to page them out (MADV_PAGEOUT, what its reclaim of idle file pages
// does, e.g. DAMON's).
func TestPinKeepsTheWeightsInMemory(t *testing.T) {
	dir := testmodel.Copy(t, testmodel.Dir(t, "tiny", 1, 0))
	unix.Sync() // dirty pages cannot be paged out
	for _, pin := range []bool{false, true} {
		before := lockedBytes(t)
		ld, err := model.Load(dir, cpu.New(1), model.LoadOptions{Lo: 0, Hi: 1, Pin: pin})
		if err != nil {
			t.Fatal(err)
		}
		if ld.PinErr != nil {
			ld.Close()
			t.Skipf("this system refuses the lock (ulimit -l): %v", ld.PinErr)
		}
		var views [][]byte
		for _, name := range ld.Checkpoint.Names() {
			if !strings.HasPrefix(name, model.LayerPrefix(0)) {
				continue
			}
			b, err := ld.Checkpoint.Bytes(name)
			if err != nil {
				t.Fatal(err)
			}
			views = append(views, b)
		}
		for _, b := range views {
			// Locked pages are refused (EINVAL), which is the point.
			if err := unix.Madvise(pages(b), unix.MADV_PAGEOUT); err != nil && !(pin && err == unix.EINVAL) {
				t.Skipf("this kernel cannot page out on request: %v", err)
			}
		}
		in, all, size := 0, 0, 0
		for _, b := range views {
			i, n := residentPages(t, b)
			in, all, size = in+i, all+n, size+len(b)
		}
		locked := lockedBytes(t) - before
		ld.Close()
		t.Logf("pinned %v: %d bytes more locked for layer 0's %d", pin, locked, size)
		if pin && locked < size || !pin && locked != 0 {
			t.Errorf("pinned %v: %d bytes more locked for layer 0's %d", pin, locked, size)
		}
		t.Logf("pinned %v: %d of layer 0's %d pages in memory after a page-out", pin, in, all)
		switch {
		case all == 0:
			t.Fatal("layer 0 has no tensors")
		case pin && in != all:
			t.Errorf("pinned: %d of %d pages in memory", in, all)
		}
	}
}

// lockedBytes is the process's locked memory (VmLck).
func lockedBytes(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmLck:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("VmLck: %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

// pages is b (a view of a mapping) widened to the page it starts in.
func pages(b []byte) []byte {
	off := int(uintptr(unsafe.Pointer(&b[0])) % uintptr(os.Getpagesize()))
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&b[0]), -off)), len(b)+off)
}

// residentPages counts the pages of b (a view of a mapping) in memory.
func residentPages(t *testing.T, b []byte) (in, all int) {
	if len(b) == 0 {
		return 0, 0
	}
	page := os.Getpagesize()
	span := pages(b)
	vec := make([]byte, (len(span)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&span[0])), uintptr(len(span)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			in++
		}
	}
	return in, len(vec)
}
