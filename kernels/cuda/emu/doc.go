// Package emu checks tandem's CUDA kernels (kernels/cuda/src) without a GPU.
//
// cuemu.h is a C++20 header that runs the same .cu sources on CPU threads:
// one thread per CUDA thread, the grid's blocks in turn, std::barrier for
// sync_threads, warp shuffles and mma.sync m16n8k16 through a per-warp
// exchange in the PTX ISA's fragment layout. driver/driver.cc launches one
// kernel, or the short chain the device backend runs for a composite op, on
// inputs it reads from stdin. The package's tests build the driver once per
// run with the host's C++ compiler (g++ or clang++; they skip without one),
// compare every kernel with the CPU backend (kernels/cpu) at a stated
// tolerance, and build it a second time with -DPLANTED_BUG, where every
// kernel carries a small deliberate bug, to prove each check can fail.
//
// The package has no non-test code and no cgo: the emulator is a separate
// process the tests talk to through pipes.
package emu
