package service

import (
	"errors"
	"strings"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// TestAdmitSubmission: the decision taken on a submission's size alone,
// before it is decoded.
func TestAdmitSubmission(t *testing.T) {
	const budget = 64 << 20
	for _, c := range []struct {
		held submitLoad
		size int64
		code cp.ErrorCode // "" admitted
		text string
	}{
		{submitLoad{}, 7 << 20, "", ""},
		{submitLoad{Bytes: 56 << 20, Count: 8}, 7 << 20, "", ""},
		{submitLoad{Bytes: 60 << 20, Count: 9}, 7 << 20, cp.CodeUnavailable, "reading 60.0 MiB of submissions, at most 64.0 MiB at once"},
		// Small submissions are answered whatever the large ones hold.
		{submitLoad{Bytes: 64 << 20, Count: 9}, 2000, "", ""},
		{submitLoad{Bytes: 64 << 20, Count: 9}, smallSubmit, "", ""},
		{submitLoad{Bytes: 64 << 20, Count: 9}, smallSubmit + 1, cp.CodeUnavailable, "retry later"},
		{submitLoad{}, budget + 1, cp.CodeTooLarge, "more than the 64.0 MiB"},
		{submitLoad{Count: maxHeldSubmits}, 100, cp.CodeUnavailable, "4096 submissions not yet answered"},
	} {
		err := admitSubmission(c.held, c.size, budget)
		if c.code == "" {
			if err != nil {
				t.Errorf("%+v, %d bytes: %v", c.held, c.size, err)
			}
			continue
		}
		var re *cp.RemoteError
		if !errors.As(err, &re) || re.Code != c.code || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%+v, %d bytes: %v, want %s %q", c.held, c.size, err, c.code, c.text)
		}
	}
}
