package media

import (
	"slices"
	"testing"
)

// 0, 255, 0, 255 halved: scale 2 widens the cubic's support to 4 pixels.
// Output 0 is centred at 1.0 and weighs inputs 0..3 by cubic((x-0.5)/2):
// 0.8671875, 0.8671875, 0.2265625, -0.0703125 (sum 1.890625), so
// 255 * (0.8671875 - 0.0703125) / 1.890625 = 107.48 -> 107. Output 1,
// centred at 3.0, weighs them -0.0703125, 0.2265625, 0.8671875, 0.8671875:
// 255 * 1.09375 / 1.890625 = 147.52 -> 148.
func TestResampleWorkedCase(t *testing.T) {
	got := resample8([]uint8{0, 255, 0, 255}, 1, 4, 1, 2, 1)
	if !slices.Equal(got, []uint8{107, 148}) {
		t.Fatalf("got %v, want [107 148]", got)
	}
	// The same along columns, and on every channel alike.
	col := resample8([]uint8{0, 0, 0, 255, 255, 255, 0, 0, 0, 255, 255, 255}, 3, 1, 4, 1, 2)
	if !slices.Equal(col, []uint8{107, 107, 107, 148, 148, 148}) {
		t.Fatalf("vertical: got %v", col)
	}
}

func TestResampleKeepsFlatImagesAndClips(t *testing.T) {
	for _, v := range []uint8{0, 1, 128, 254, 255} {
		in := make([]uint8, 3*37*23)
		for i := range in {
			in[i] = v
		}
		for _, size := range [][2]int{{36, 23}, {18, 11}, {5, 3}, {1, 1}, {37, 7}} {
			out := resample8(in, 3, 37, 23, size[0], size[1])
			for i, o := range out {
				if o != v {
					t.Fatalf("flat %d resized to %v: byte %d is %d", v, size, i, o)
				}
			}
		}
	}
	// A hard edge overshoots with a = -0.5 and is clipped, never wrapped.
	edge := []uint8{0, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0}
	out := resample8(edge, 1, 12, 1, 7, 1)
	if out[0] != 0 || out[len(out)-1] != 0 || slices.Max(out) < 200 {
		t.Fatalf("edge resized: %v", out)
	}
}

// Nearest neighbour (palette images): output i reads input
// trunc((i + 0.5) * in/out), the position accumulated step by step.
func TestNearestWorkedCase(t *testing.T) {
	in := []uint8{0, 1, 2, 3, 4, 5, 6}
	got := nearest(in, 7, 1, 3, 1)
	// steps of 7/3 from 7/6: 1.17, 3.5, 5.83 -> 1, 3, 5
	if !slices.Equal(got, []uint8{1, 3, 5}) {
		t.Fatalf("got %v, want [1 3 5]", got)
	}
}
