package controlplane

import (
	"errors"
	"reflect"
	"testing"
)

// fuzzDecode checks the decoder's contract on arbitrary bytes: it never
// panics (not even a panic it catches itself), rejects with ErrInvalid, and
// whatever it accepts is valid and survives a round trip unchanged.
func fuzzDecode[T any, P interface {
	*T
	Message
}](f *testing.F, enc Encoding) {
	for _, m := range sampleMessages() {
		if _, ok := m.(P); !ok {
			continue
		}
		data, err := Marshal(enc, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"prompt":"x","stop":["a",1,null]}`))
	f.Add([]byte(`{"token_ids":[1,2,3],"max_tokens":-1}`))
	f.Add([]byte{0x81, 0xa6, 's', 't', 'o', 'p', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		v := P(new(T))
		err := Unmarshal(enc, data, v)
		if err != nil {
			if errors.Is(err, errDecoderPanic) {
				t.Fatalf("decoder panicked on %q: %v", data, err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("rejection does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := v.Validate(); err != nil {
			t.Fatalf("accepted an invalid message: %v", err)
		}
		again, err := Marshal(enc, v)
		if err != nil {
			t.Fatalf("re-encode of an accepted message: %v", err)
		}
		w := P(new(T))
		if err := Unmarshal(enc, again, w); err != nil {
			t.Fatalf("re-decode of an accepted message: %v\n%q", err, again)
		}
		normTimes(reflect.ValueOf(v))
		normTimes(reflect.ValueOf(w))
		if !reflect.DeepEqual(v, w) {
			t.Fatalf("round trip changed the message:\n%#v\n%#v", v, w)
		}
	})
}

func FuzzSubmitRequestJSON(f *testing.F)    { fuzzDecode[SubmitRequest](f, JSON) }
func FuzzSubmitRequestMsgpack(f *testing.F) { fuzzDecode[SubmitRequest](f, MsgPack) }
func FuzzAssignmentMsgpack(f *testing.F)    { fuzzDecode[Assignment](f, MsgPack) }
func FuzzWorkerInfoMsgpack(f *testing.F)    { fuzzDecode[WorkerInfo](f, MsgPack) }
func FuzzJobEventJSON(f *testing.F)         { fuzzDecode[JobEvent](f, JSON) }
func FuzzCacheReplyMsgpack(f *testing.F)    { fuzzDecode[CacheReply](f, MsgPack) }
