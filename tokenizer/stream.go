package tokenizer

import "fmt"

// StreamDecoder turns a stream of token ids into text as they arrive. A
// token can end inside a UTF-8 character; the decoder holds such a tail back
// until the next token completes it, and never hands out ill-formed UTF-8.
// Whatever the split of a sequence into Push calls, the concatenation of the
// results and Flush equals DecodeString of the whole sequence.
//
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte // bytes of a possibly incomplete character
	out     []byte // scratch for the text handed out
}

// NewStreamDecoder returns a decoder for t's tokens.
func NewStreamDecoder(t *Tokenizer) *StreamDecoder {
	return &StreamDecoder{t: t}
}

// Push adds a token and returns the text it completes, which may be empty.
// An id outside the vocabulary is an error and leaves the decoder as it was.
func (d *StreamDecoder) Push(id int) (string, error) {
	buf, err := d.t.appendToken(d.pending, id)
	if err != nil {
		return "", fmt.Errorf("tokenizer: stream decode: %w", err)
	}
	out, used := appendValid(d.out[:0], buf, false)
	d.out = out
	// Keep the unconsumed tail, at most three bytes, at the front.
	d.pending = append(buf[:0], buf[used:]...)
	return string(out), nil
}

// Flush returns the held-back bytes, each ill-formed subpart as U+FFFD, and
// resets the decoder for a new sequence.
func (d *StreamDecoder) Flush() string {
	out, _ := appendValid(d.out[:0], d.pending, true)
	d.pending = d.pending[:0]
	return string(out)
}

// Pending reports how many bytes are held back waiting for the rest of a
// character.
func (d *StreamDecoder) Pending() int { return len(d.pending) }
