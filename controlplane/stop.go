package controlplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Stop lists what ends generation early: token ids and/or text. On the wire
// it is one list mixing integers (token ids) and strings, e.g.
// ["\n\n", 163586]; a single string or integer is accepted too.
type Stop struct {
	TokenIDs []int32
	Texts    []string
}

// IsZero reports whether there is no stop condition (it drives omitempty
// and omitzero).
func (s Stop) IsZero() bool { return len(s.TokenIDs) == 0 && len(s.Texts) == 0 }

func (s *Stop) validate(msg string) error {
	if n := len(s.TokenIDs) + len(s.Texts); n > MaxStops {
		return fieldErr(msg, "stop", "has %d entries, at most %d allowed", n, MaxStops)
	}
	for i, id := range s.TokenIDs {
		if id < 0 {
			return fieldErr(msg, "stop", "token id #%d is %d, token ids are >= 0", i, id)
		}
	}
	for i, t := range s.Texts {
		if t == "" {
			return fieldErr(msg, "stop", "text #%d is empty", i)
		}
		if len(t) > MaxStopTextBytes || !utf8.ValidString(t) {
			return fieldErr(msg, "stop", "text #%d must be valid UTF-8 of at most %d bytes", i, MaxStopTextBytes)
		}
	}
	return nil
}

// MarshalJSON writes the texts, then the token ids, as one JSON array.
func (s Stop) MarshalJSON() ([]byte, error) {
	items := make([]any, 0, len(s.Texts)+len(s.TokenIDs))
	for _, t := range s.Texts {
		items = append(items, t)
	}
	for _, id := range s.TokenIDs {
		items = append(items, id)
	}
	return json.Marshal(items)
}

// UnmarshalJSON accepts null, a string, an integer, or an array of strings
// and integers.
func (s *Stop) UnmarshalJSON(data []byte) error {
	*s = Stop{}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || string(data) == "null" {
		return nil
	}
	if data[0] != '[' {
		return s.addJSON(data, -1)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if len(items) > MaxStops {
		return fmt.Errorf("stop: has %d entries, at most %d allowed", len(items), MaxStops)
	}
	for i, it := range items {
		if err := s.addJSON(bytes.TrimSpace(it), i); err != nil {
			return err
		}
	}
	return nil
}

func (s *Stop) addJSON(item []byte, i int) error {
	where := "stop"
	if i >= 0 {
		where = fmt.Sprintf("stop[%d]", i)
	}
	if len(item) > 0 && item[0] == '"' {
		var t string
		if err := json.Unmarshal(item, &t); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		s.Texts = append(s.Texts, t)
		return nil
	}
	id, err := strconv.ParseInt(string(item), 10, 32)
	if err != nil {
		return fmt.Errorf("%s: want a token id (an integer that fits int32) or a string, got %.32s", where, item)
	}
	s.TokenIDs = append(s.TokenIDs, int32(id))
	return nil
}

var (
	_ msgpack.CustomEncoder = Stop{}
	_ msgpack.CustomDecoder = (*Stop)(nil)
)

// EncodeMsgpack writes the texts, then the token ids, as one array.
func (s Stop) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(len(s.Texts) + len(s.TokenIDs)); err != nil {
		return err
	}
	for _, t := range s.Texts {
		if err := enc.EncodeString(t); err != nil {
			return err
		}
	}
	for _, id := range s.TokenIDs {
		if err := enc.EncodeInt(int64(id)); err != nil {
			return err
		}
	}
	return nil
}

// DecodeMsgpack accepts nil, a string, an integer, or an array of strings
// and integers.
func (s *Stop) DecodeMsgpack(dec *msgpack.Decoder) error {
	*s = Stop{}
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case c == msgpcode.Nil:
		return dec.DecodeNil()
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if n > MaxStops {
			return fmt.Errorf("stop: has %d entries, at most %d allowed", n, MaxStops)
		}
		for i := 0; i < n; i++ {
			if err := s.addMsgpack(dec, i); err != nil {
				return err
			}
		}
		return nil
	}
	return s.addMsgpack(dec, -1)
}

func (s *Stop) addMsgpack(dec *msgpack.Decoder, i int) error {
	where := "stop"
	if i >= 0 {
		where = fmt.Sprintf("stop[%d]", i)
	}
	c, err := dec.PeekCode()
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	switch {
	case msgpcode.IsString(c):
		t, err := dec.DecodeString()
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		s.Texts = append(s.Texts, t)
		return nil
	case msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		v, err := dec.DecodeInt64()
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if c == msgpcode.Uint64 && v < 0 || v < math.MinInt32 || v > math.MaxInt32 {
			return fmt.Errorf("%s: token id does not fit int32", where)
		}
		s.TokenIDs = append(s.TokenIDs, int32(v))
		return nil
	}
	return fmt.Errorf("%s: want a token id (an integer) or a string, got msgpack code 0x%02x", where, c)
}
