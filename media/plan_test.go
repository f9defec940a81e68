package media

import "testing"

// The expected values are worked by hand from the rule in plan.go.
func TestPlanWorkedCases(t *testing.T) {
	cases := []struct {
		w, h                 int
		rw, rh, gw, gh, rows int
	}{
		{1, 1, 1, 1, 2, 2, 1},
		{28, 28, 28, 28, 2, 2, 1},
		{29, 28, 29, 28, 4, 2, 2},
		{101, 57, 101, 57, 8, 6, 12},
		{100, 100, 100, 100, 8, 8, 16},
		// 285*214 = 60,990 patches: under the budget, kept, padded to 4004x3024.
		{4000, 3000, 4000, 3000, 286, 216, 143 * 108},
		// The side limit: s = 7168/10000, 100*s = 71.68 -> 71, padded to 84.
		{10000, 100, 7168, 71, 512, 6, 256 * 3},
		// The patch budget: 571*571 patches, s = sqrt(65536/326041) = 0.44834,
		// 8000*s = 3586.7 -> 3586, padded to 3612 (129 merged rows a side).
		{8000, 8000, 3586, 3586, 258, 258, 129 * 129},
		// 7000x20: 500 patches, s = 7168/7000 > 1: kept.
		{7000, 20, 7000, 20, 500, 2, 250},
	}
	for _, c := range cases {
		rw, rh, gw, gh, err := Plan(c.w, c.h)
		if err != nil {
			t.Fatalf("Plan(%d, %d): %v", c.w, c.h, err)
		}
		if rw != c.rw || rh != c.rh || gw != c.gw || gh != c.gh {
			t.Errorf("Plan(%d, %d) = %d, %d, grid %dx%d; want %d, %d, grid %dx%d", c.w, c.h, rw, rh, gw, gh, c.rw, c.rh, c.gw, c.gh)
		}
		im := Image{GridW: gw, GridH: gh}
		if im.Rows() != c.rows {
			t.Errorf("%dx%d: Rows() = %d, want %d", c.w, c.h, im.Rows(), c.rows)
		}
	}
}

func TestPlanInvariants(t *testing.T) {
	sizes := []int{1, 2, 13, 14, 15, 27, 28, 29, 55, 56, 57, 100, 333, 517, 1000, 1023, 1024, 3000, 4096, 7167, 7168, 7169, 9000, 20000, 100000}
	for _, w := range sizes {
		for _, h := range sizes {
			rw, rh, gw, gh, err := Plan(w, h)
			if err != nil {
				t.Fatalf("Plan(%d, %d): %v", w, h, err)
			}
			switch {
			case rw < 1 || rh < 1 || rw > w || rh > h:
				t.Errorf("Plan(%d, %d): resized %dx%d is not within 1..original (never upscale)", w, h, rw, rh)
			case rw > 7168 || rh > 7168 || gw > 512 || gh > 512:
				t.Errorf("Plan(%d, %d): %dx%d, grid %dx%d is over 512 patches a side", w, h, rw, rh, gw, gh)
			case gw%2 != 0 || gh%2 != 0:
				t.Errorf("Plan(%d, %d): grid %dx%d is not even", w, h, gw, gh)
			case gw*14 < rw || gw*14-rw >= 28 || gh*14 < rh || gh*14-rh >= 28:
				t.Errorf("Plan(%d, %d): grid %dx%d does not pad %dx%d to the next multiple of 28", w, h, gw, gh, rw, rh)
			}
			// Images under the budget and the side limit are kept as they are.
			if max(1, w/14)*max(1, h/14) <= 65536 && w <= 7168 && h <= 7168 && (rw != w || rh != h) {
				t.Errorf("Plan(%d, %d) resized to %dx%d; an image within the limits is kept", w, h, rw, rh)
			}
		}
	}
	for _, bad := range [][2]int{{0, 1}, {1, 0}, {-5, 10}, {1 << 25, 1}} {
		if _, _, _, _, err := Plan(bad[0], bad[1]); err == nil {
			t.Errorf("Plan(%d, %d) gave no error", bad[0], bad[1])
		}
	}
}
