package tokenizer

import (
	"strings"
	"testing"
)

func TestStopTextAcrossPieces(t *testing.T) {
	for _, c := range []struct {
		stops  []string
		pieces []string
		out    string
		stop   bool
	}{
		{nil, []string{"ab", "c"}, "abc", false},
		{[]string{"\n\n"}, []string{"one\n", "\ntwo"}, "one", true},
		{[]string{"END"}, []string{"xE", "N", "Dyz"}, "x", true},
		{[]string{"END"}, []string{"xE", "N", "o"}, "xENo", false},
		{[]string{"abc", "b"}, []string{"a", "bc"}, "", true},
		{[]string{"abd", "b"}, []string{"a", "bc"}, "a", true},
		{[]string{"été"}, []string{"l'é", "t", "é!"}, "l'", true},
		{[]string{"stop"}, []string{"st"}, "st", false}, // flushed at the end
	} {
		s := &StopText{Stops: c.stops}
		var b strings.Builder
		stopped := false
		for _, p := range c.pieces {
			out, st := s.Push(p)
			b.WriteString(out)
			if st {
				stopped = true
				break
			}
		}
		if !stopped {
			b.WriteString(s.Flush())
		}
		if b.String() != c.out || stopped != c.stop {
			t.Errorf("stops %q pieces %q: got %q stopped %v, want %q %v", c.stops, c.pieces, b.String(), stopped, c.out, c.stop)
		}
	}
}
