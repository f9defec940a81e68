//go:build linux || darwin || freebsd || netbsd || openbsd

package diskfree

import "golang.org/x/sys/unix"

func bytesAvail(path string) (int64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}

func allocated(path string) (int64, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false
	}
	return int64(st.Blocks) * 512, true // st_blocks counts 512-byte units on every one of these systems
}
