package tokenizer

import "strings"

// StopText watches generated text for stop strings. It holds back the end
// of the text while it could still be the start of a stop string, so that
// no part of a stop string is ever handed out.
type StopText struct {
	Stops []string
	held  string
}

// Push adds a piece of text and returns what can be handed out, and
// whether a stop string was completed (then out ends just before it and
// the rest is dropped).
func (s *StopText) Push(piece string) (out string, stopped bool) {
	buf := s.held + piece
	if len(s.Stops) == 0 {
		s.held = ""
		return buf, false
	}
	first := -1
	for _, st := range s.Stops {
		if i := strings.Index(buf, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		s.held = ""
		return buf[:first], true
	}
	// Hold back the longest tail that a stop string starts with.
	keep := 0
	for _, st := range s.Stops {
		for n := min(len(st)-1, len(buf)); n > keep; n-- {
			if strings.HasPrefix(st, buf[len(buf)-n:]) {
				keep = n
				break
			}
		}
	}
	s.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

// Flush returns the held-back text at the end of generation.
func (s *StopText) Flush() string {
	out := s.held
	s.held = ""
	return out
}
