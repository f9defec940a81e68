// Package sysverbs binds the system's RDMA verbs library (libibverbs on
// Linux, Apple's on macOS) at run time without cgo, through purego, and
// offers it as the verbs.Provider the RDMA link runs on. Its mirrored C
// structs are checked against the installed header by a layout test.
// Where a system has no verbs library, System reports so.
package sysverbs
