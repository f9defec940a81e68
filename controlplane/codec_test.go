package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tandem-inference/tandem/grammar"
)

var when = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)

func layer(n int) *int { return &n }

// sampleMessages holds one full example of every message type.
func sampleMessages() []Message {
	return []Message{
		&SubmitRequest{TokenIDs: []int32{0, 5, 163583}, Sampling: Sampling{MaxTokens: 16, Temperature: 0.7, TopP: 0.9, TopK: 40, Seed: 7,
			Stop: Stop{TokenIDs: []int32{163586}, Texts: []string{"\n\n"}}}, IdempotencyKey: "k1", Policy: PolicyRemote},
		&SubmitRequest{Prompt: "Hello", Sampling: Sampling{Stop: Stop{Texts: []string{"."}}}},
		&SubmitRequest{Messages: []ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi", Name: "ann"}}},
		&SubmitReply{JobID: "j-abc", Duplicate: true},
		&SubmitReply{Error: "prompt too long", Code: CodeTooLarge},
		&JobEvent{JobID: "j-abc", Seq: 3, State: StatePrefilling, Time: when, Submitted: when.Add(-time.Second), Progress: &LayerProgress{Done: 4, Total: 13},
			Route: &RouteDecision{Policy: PolicyAuto, Target: TargetRemote, PredictedLocal: 40 * time.Second, PredictedRemote: 31 * time.Second, PrefillWorker: "gpu-0", DecodeGroup: "macs", Reason: "remote is 9s faster"}},
		&JobEvent{JobID: "j-abc", Seq: 9, State: StateFailed, Time: when, Submitted: when, Error: &JobError{Code: CodeUnavailable, Worker: "mac-2", Layer: layer(0), Message: "heartbeat expired"},
			Timing: &Timing{Queue: time.Millisecond, Prefill: time.Second, FirstToken: 2 * time.Second, PromptTokens: 3000, OutputTokens: 2, DecodeTokensPerSec: 21.5}},
		&TokenMsg{JobID: "j-abc", Index: 0, TokenID: 42, Text: "Hi"},
		&TokenMsg{JobID: "j-abc", Index: 5, TokenID: -1, Final: true, FinishReason: FinishLength},
		&CancelRequest{JobID: "j-abc", Reason: "user"},
		&CancelReply{JobID: "j-abc", State: StateCancelled, FreedBytes: 1 << 30},
		&ListJobsRequest{State: StateDecoding, Limit: 10},
		&ListJobsReply{Jobs: []JobEvent{{JobID: "j-1", Seq: 1, State: StateQueued, Time: when, Submitted: when}}},
		&WorkerInfo{ID: "mac-1", Kind: KindDecode, Backend: "metal", Model: "k3", GroupID: "macs", Rank: 1, GroupSize: 4, Layers: LayerRange{First: 24, End: 48},
			MemoryTotal: 512 << 30, MemoryFree: 100 << 30, MaxSeqTokens: 300000, QueueDepth: 1, Active: 2, PrefillChunk: 512,
			Rates:     Rates{PrefillTokensPerSec: 120, DecodeTokensPerSec: 22, LinkBytesPerSec: 1.1e9},
			Endpoints: Endpoints{Transfer: "10.0.0.2:7401", Pipeline: "10.0.0.2:7402", Metrics: "10.0.0.2:9100"}, Started: when, Time: when,
			PrefixCache: &PrefixCacheInfo{Entries: 2, Bytes: 1 << 30, Lookups: 9, Hits: 7, HitTokens: 7000, Misses: 2, Evictions: 1, Salt: 42,
				Prefixes: []CachedPrefix{{Link: 7, Tokens: 128}, {Link: 9, Tokens: 64}}}},
		&WorkerInfo{ID: "gpu-0", Kind: KindPrefill, Backend: "cuda", MemoryTotal: 141 << 30, Rates: Rates{PassFloor: 28 * time.Second}, Time: when},
		&Assignment{JobID: "j-abc", Role: RolePrefill, WorkerID: "gpu-0", GroupID: "macs", Client: "c-1", TokenIDs: []int32{1, 2}, Sampling: Sampling{MaxTokens: 3},
			Placement: []LayerPlacement{
				{Rank: 0, WorkerID: "mac-0", Layers: LayerRange{0, 30}, Transfer: "h0:1", SessionID: "s-0", Secret: make([]byte, SecretSize)},
				{Rank: 1, WorkerID: "mac-1", Layers: LayerRange{30, 61}, Transfer: "h1:1", SessionID: "s-1", Secret: NewSecret()}},
			Deadline: when, Images: [][]byte{{0x89, 'P', 'N', 'G'}}},
		&AssignReply{JobID: "j-abc", WorkerID: "gpu-0", Accepted: true, ReservedBytes: 1 << 20},
		&AssignReply{JobID: "j-abc", WorkerID: "mac-1", Error: "not enough memory: need 8 GiB, 2 GiB free", Code: CodeUnavailable},
		&Progress{JobID: "j-abc", WorkerID: "gpu-0", Stage: StatePrefilling, Time: when, Layers: &LayerProgress{Done: 1, Total: 61}, Tokens: 300000, Bytes: 1 << 27,
			Elapsed: time.Second, Measured: &Rates{PrefillTokensPerSec: 2500}},
		&QueuedJob{JobID: "j-abc", Submitted: when, Request: SubmitRequest{TokenIDs: []int32{1}}, Client: "c-1"},
		&AvailabilityRequest{},
		&AvailabilityReply{Model: "k3", DecodeGroups: 1, DecodeRanks: 4, PrefillWorkers: 1, MaxTokens: 300000, Problems: []string{"group b: rank 1 of 2 not registered"}},
		&AvailabilityReply{Error: "shutting down", Code: CodeUnavailable},
		&CacheRequest{WorkerID: "mac-0", Op: CacheList},
		&CacheRequest{WorkerID: "gpu-0", Op: CacheDrop, Key: "00f3a1b2c3d4e5f6-128"},
		&CacheRequest{WorkerID: "mac-0", Op: CacheDrop, All: true},
		&CacheReply{WorkerID: "mac-0", Kind: KindDecode, Model: "m-0123456789ab-ba9876543210", CacheDType: "bf16", GroupID: "macs", Total: 2, Bytes: 3 << 20,
			Entries: []CacheEntry{{Key: "7", Prefix: "00f3a1b2c3d4e5f6", Tokens: 128, Snapshots: 2, Bytes: 2 << 20, LastUse: when},
				{Key: "3", Tokens: 64, Snapshots: 1, Bytes: 1 << 20, LastUse: when.Add(-time.Minute)}}},
		&CacheReply{WorkerID: "gpu-0", Kind: KindPrefill, Model: "m-0123456789ab-ba9876543210", CacheDType: "f32", Dropped: 1},
		&CacheReply{WorkerID: "mac-1", Kind: KindDecode, GroupID: "macs", Rank: 1, Off: true},
		&CacheReply{Error: "decode rank mac-0: listing cache entries: context deadline exceeded", Code: CodeUnavailable},
		&SubmitRequest{Prompt: "Hello", Sampling: Sampling{Grammar: &grammar.Spec{Mode: grammar.ModeToolCall, Thinking: true, ThinkBudget: 64, Tool: "f",
			Tools: []grammar.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`)}, {Name: "g"}}}}},
		&SubmitRequest{Prompt: "Hello", Sampling: Sampling{Grammar: &grammar.Spec{Mode: grammar.ModeJSONSchema, Schema: json.RawMessage(`{"type":"array"}`)}}},
		&SubmitRequest{Messages: []ChatMessage{{Role: "user", Parts: []ContentPart{{Type: PartText, Text: "what is this?"}, {Type: PartImage}}}},
			Images: [][]byte{[]byte("\x89PNG\r\n\x1a\n...")}},
		&SubmitRequest{TokenIDs: []int32{7, 9, 9, 9, 8}, Images: [][]byte{{0xff, 0xd8, 0xff}}},
		&WorkerInfo{ID: "mac-3", Kind: KindDecode, Backend: "metal", Model: "k3", GroupID: "macs", Rank: 3, GroupSize: 4, TensorRank: 1, TensorRanks: 2,
			Layers: LayerRange{First: 30, End: 61}, Time: when},
		tensorAssignment(),
	}
}

// tensorAssignment is a prefill assignment to a 2x2 group: two stages of
// two tensor ranks.
func tensorAssignment() *Assignment {
	a := &Assignment{JobID: "j-tp", Role: RolePrefill, WorkerID: "gpu-0", GroupID: "macs", Client: "c-1", TokenIDs: []int32{1, 2}, Sampling: Sampling{MaxTokens: 3}}
	secret := NewSecret()
	for r, lr := range []LayerRange{{0, 30}, {0, 30}, {30, 61}, {30, 61}} {
		a.Placement = append(a.Placement, LayerPlacement{Rank: r, WorkerID: fmt.Sprintf("mac-%d", r), Layers: lr, TensorRank: r % 2, TensorRanks: 2,
			Transfer: fmt.Sprintf("h%d:1", r), SessionID: "s-0", Secret: secret})
	}
	return a
}

func TestRoundTripEveryMessage(t *testing.T) {
	for _, enc := range []Encoding{MsgPack, JSON} {
		for _, m := range sampleMessages() {
			if err := m.Validate(); err != nil {
				t.Fatalf("sample %T does not validate: %v", m, err)
			}
			data, err := Marshal(enc, m)
			if err != nil {
				t.Fatalf("%s %T: %v", enc, m, err)
			}
			back := reflect.New(reflect.TypeOf(m).Elem()).Interface().(Message)
			if err := Unmarshal(enc, data, back); err != nil {
				t.Fatalf("%s %T: %v\n%s", enc, m, err, data)
			}
			normTimes(reflect.ValueOf(back))
			if !reflect.DeepEqual(m, back) {
				t.Errorf("%s %T round trip:\n got %#v\nwant %#v", enc, m, back, m)
			}
		}
	}
}

// normTimes sets every time.Time reachable from v to UTC: msgpack decodes
// times in the local zone, and DeepEqual compares zones, not instants.
func normTimes(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			normTimes(v.Elem())
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			normTimes(v.Index(i))
		}
	case reflect.Struct:
		if t, ok := v.Interface().(time.Time); ok {
			if v.CanSet() {
				v.Set(reflect.ValueOf(t.UTC()))
			}
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				normTimes(v.Field(i))
			}
		}
	}
}

// The wire names are the protocol: a JSON client writes exactly these.
func TestJSONWireNames(t *testing.T) {
	var r SubmitRequest
	in := `{"token_ids":[1,2],"max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":3,"seed":9,"stop":["END",7],"idempotency_key":"x","policy":"local"}`
	if err := Unmarshal(JSON, []byte(in), &r); err != nil {
		t.Fatal(err)
	}
	want := SubmitRequest{TokenIDs: []int32{1, 2}, Sampling: Sampling{MaxTokens: 5, Temperature: 0.5, TopP: 0.9, TopK: 3, Seed: 9,
		Stop: Stop{TokenIDs: []int32{7}, Texts: []string{"END"}}}, IdempotencyKey: "x", Policy: PolicyLocal}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("got %+v\nwant %+v", r, want)
	}
	out, _ := Marshal(JSON, &SubmitReply{JobID: "j-1"})
	if string(out) != `{"job_id":"j-1"}` {
		t.Fatalf("reply JSON %s", out)
	}
	// The msgpack names are the same.
	mp, _ := Marshal(MsgPack, &r)
	var m map[string]any
	if err := msgpack.Unmarshal(mp, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"token_ids", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "idempotency_key", "policy"} {
		if _, ok := m[k]; !ok {
			t.Errorf("msgpack encoding lacks %q: %v", k, m)
		}
	}
}

func TestStopForms(t *testing.T) {
	for in, want := range map[string]Stop{
		`"END"`:             {Texts: []string{"END"}},
		`163586`:            {TokenIDs: []int32{163586}},
		`["a", 1, "b", 2]`:  {TokenIDs: []int32{1, 2}, Texts: []string{"a", "b"}},
		`null`:              {},
		`[]`:                {},
		` [ "sp ace" , 0 ]`: {TokenIDs: []int32{0}, Texts: []string{"sp ace"}},
	} {
		var r SubmitRequest
		if err := Unmarshal(JSON, []byte(`{"prompt":"p","stop":`+in+`}`), &r); err != nil {
			t.Errorf("stop %s: %v", in, err)
			continue
		}
		if !reflect.DeepEqual(r.Stop.TokenIDs, want.TokenIDs) && len(r.Stop.TokenIDs)+len(want.TokenIDs) > 0 ||
			!reflect.DeepEqual(r.Stop.Texts, want.Texts) && len(r.Stop.Texts)+len(want.Texts) > 0 {
			t.Errorf("stop %s: got %+v, want %+v", in, r.Stop, want)
		}
	}
	// msgpack: a bare string and a bare integer too.
	for _, v := range []any{"END", 12, []any{"x", 3}} {
		data, _ := msgpack.Marshal(map[string]any{"prompt": "p", "stop": v})
		var r SubmitRequest
		if err := Unmarshal(MsgPack, data, &r); err != nil || r.Stop.IsZero() {
			t.Errorf("msgpack stop %v: %+v, %v", v, r.Stop, err)
		}
	}
}

// Every malformed submission named in issue #6 gets an error that wraps
// ErrInvalid and says what is wrong and where.
func TestMalformedSubmissions(t *testing.T) {
	mp := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		enc  Encoding
		data []byte
		want string
	}{
		{"empty json", JSON, nil, "empty input"},
		{"bad json", JSON, []byte(`{"prompt": "x",}`), "malformed JSON at byte"},
		{"truncated json", JSON, []byte(`{"prompt": "x"`), "ends in the middle"},
		{"json array", JSON, []byte(`[1,2]`), "want an object"},
		{"trailing json", JSON, []byte(`{"prompt":"x"} {"prompt":"y"}`), "trailing data"},
		{"unknown json field", JSON, []byte(`{"prompt":"x","max_tokenz":3}`), `unknown field "max_tokenz"`},
		{"wrong type json", JSON, []byte(`{"prompt":"x","max_tokens":"ten"}`), `"max_tokens": got a JSON string, want int`},
		{"token id overflow", JSON, []byte(`{"token_ids":[1, 3000000000]}`), "token_ids"},
		{"token id 2^32+5 json", JSON, []byte(`{"token_ids":[4294967301]}`), "token_ids"},
		{"token id -2^32+5 json", JSON, []byte(`{"token_ids":[-4294967291]}`), "token_ids"},
		{"token id 2^63+5 json", JSON, []byte(`{"token_ids":[9223372036854775813]}`), "token_ids"},
		{"stop of wrong type", JSON, []byte(`{"prompt":"x","stop":[true]}`), "stop[0]"},
		{"empty prompt", JSON, []byte(`{"prompt":""}`), "empty prompt"},
		{"no prompt", JSON, []byte(`{"max_tokens":3}`), "empty prompt"},
		{"null", JSON, []byte(`null`), "empty prompt"},
		{"two prompts", JSON, []byte(`{"prompt":"x","token_ids":[1]}`), "only one of"},
		{"negative max_tokens", JSON, []byte(`{"prompt":"x","max_tokens":-1}`), "SubmitRequest.max_tokens: is -1, must be >= 0"},
		{"negative token id", JSON, []byte(`{"token_ids":[4,-2]}`), "token_ids[1]: is -2"},
		{"temperature too high", JSON, []byte(`{"prompt":"x","temperature":1e9}`), "temperature"},
		{"top_p out of range", JSON, []byte(`{"prompt":"x","top_p":1.5}`), "top_p"},
		{"bad policy", JSON, []byte(`{"prompt":"x","policy":"fastest"}`), `policy: is "fastest"`},
		{"bad chat role", JSON, []byte(`{"messages":[{"role":"wizard","content":"x"}]}`), "messages[0].role"},
		{"blank chat", JSON, []byte(`{"messages":[{"role":"user","content":"  "}]}`), "empty prompt"},
		{"newline in key", JSON, []byte(`{"prompt":"x","idempotency_key":"a\nb"}`), "control character"},
		{"empty msgpack", MsgPack, nil, "empty input"},
		{"json sent as msgpack", MsgPack, []byte(`{"prompt":"x"}`), "without Content-Type: application/json"},
		{"msgpack array", MsgPack, mp([]int{1}), "got a array, want a map"},
		{"truncated msgpack", MsgPack, mp(map[string]any{"prompt": "hello"})[:5], "SubmitRequest"},
		{"trailing msgpack", MsgPack, append(mp(map[string]any{"prompt": "x"}), 0xc0), "trailing bytes"},
		{"unknown msgpack field", MsgPack, mp(map[string]any{"prompt": "x", "bogus": 1}), `"bogus": unknown field`},
		{"wrong type msgpack", MsgPack, mp(map[string]any{"prompt": "x", "max_tokens": "ten"}), "max_tokens: got a msgpack string, want int"},
		{"wrong nested type msgpack", MsgPack, mp(map[string]any{"messages": []any{map[string]any{"role": 5, "content": "x"}}}), "messages[0].role: got a msgpack integer"},
		{"NaN temperature", MsgPack, mp(map[string]any{"prompt": "x", "temperature": math.NaN()}), "temperature: is NaN"},
		{"infinite temperature", MsgPack, mp(map[string]any{"prompt": "x", "temperature": math.Inf(1)}), "temperature"},
		{"invalid utf-8", MsgPack, mp(map[string]any{"prompt": "\xff\xfe"}), "UTF-8"},
		{"huge array header", MsgPack, []byte("\x81\xa9token_ids\xdd\xff\xff\xff\xff\x01"), "overruns"},
		{"huge map header", MsgPack, []byte("\x81\xa8messages\x91\xdf\x7f\xff\xff\xff"), "overruns"},
		{"deep nesting", MsgPack, append([]byte("\x81\xa4stop"), bytes.Repeat([]byte{0x91}, 100)...), "nested deeper"},
		{"unused code", MsgPack, []byte("\x81\xa6prompt\xc1"), "not msgpack"},
		// msgpack's decoder would wrap these into the int32 ids as 5; JSON
		// refuses them (above), and so must msgpack.
		{"token id 2^32+5", MsgPack, mp(map[string]any{"token_ids": []int64{1, 1<<32 + 5}}), `"token_ids[1]": integer 4294967301 is out of range for int32`},
		{"token id -2^32+5", MsgPack, mp(map[string]any{"token_ids": []int64{-(1 << 32) + 5}}), `"token_ids[0]": integer -4294967291 is out of range for int32`},
		{"token id 2^63+5", MsgPack, mp(map[string]any{"token_ids": []uint64{1<<63 + 5}}), `"token_ids[0]": integer 9223372036854775813 is out of range for int32`},
		{"stop id 2^32+5", MsgPack, mp(map[string]any{"prompt": "x", "stop": []any{"x", int64(1<<32 + 5)}}), "stop[1]: token id does not fit int32"},
		{"negative seed", MsgPack, mp(map[string]any{"prompt": "x", "seed": -1}), `"seed": integer -1 is out of range for uint64`},
		{"max_tokens 2^63+5", MsgPack, mp(map[string]any{"prompt": "x", "max_tokens": uint64(1<<63 + 5)}), `"max_tokens": integer 9223372036854775813 is out of range for int`},
		{"oversized", MsgPack, make([]byte, MaxMessageSize+1), "at most"},
		{"images with a text prompt", JSON, []byte(`{"prompt":"x","images":["iVBORw0K"]}`), "images: are given with a text prompt"},
		{"images not base64", JSON, []byte(`{"token_ids":[1],"images":["not base64!"]}`), "not valid base64"},
		{"empty image", JSON, []byte(`{"token_ids":[1],"images":[""]}`), "images[0]: is empty"},
		{"more images than parts", JSON, []byte(`{"messages":[{"role":"user","parts":[{"type":"image"}]}],"images":["AQ==","AQ=="]}`), "2 images for 1 image parts"},
		{"image part without image", JSON, []byte(`{"messages":[{"role":"user","parts":[{"type":"text","text":"a"},{"type":"image"}]}]}`), "0 images for 1 image parts"},
		{"parts and content", JSON, []byte(`{"messages":[{"role":"user","content":"x","parts":[{"type":"text","text":"a"}]}]}`), "messages[0].parts: are given with content"},
		{"bad part type", JSON, []byte(`{"messages":[{"role":"user","parts":[{"type":"audio"}]}]}`), `messages[0].parts[0].type: is "audio"`},
		{"text on an image part", JSON, []byte(`{"messages":[{"role":"user","parts":[{"type":"image","text":"x"}]}],"images":["AQ=="]}`), "parts[0].text: is given on an image part"},
		{"too many images", MsgPack, mp(map[string]any{"token_ids": []int32{1}, "images": make([][]byte, MaxImages+1)}), "at most 64 allowed"},
		{"image of wrong type msgpack", MsgPack, mp(map[string]any{"token_ids": []int32{1}, "images": []any{7}}), "images[0]"},
		{"huge bin header", MsgPack, []byte("\x82\xa9token_ids\x91\x01\xa6images\x91\xc6\x7f\xff\xff\xff"), "SubmitRequest"},
		{"huge image count", MsgPack, []byte("\x82\xa9token_ids\x91\x01\xa6images\xdd\x7f\xff\xff\xff\xc4\x01\x01"), "overruns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r SubmitRequest
			err := Unmarshal(tc.enc, tc.data, &r)
			if err == nil {
				t.Fatalf("accepted: %+v", r)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to mention %q", err, tc.want)
			}
			if errors.Is(err, errDecoderPanic) {
				t.Errorf("the decoder panicked: %v", err)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	ok := sampleMessages()
	for _, tc := range []struct {
		name string
		m    Message
		want string
	}{
		{"reply with both", &SubmitReply{JobID: "j-1", Error: "x"}, "both"},
		{"reply with neither", &SubmitReply{}, "neither"},
		{"reply with bad code", &SubmitReply{Error: "x", Code: "oops"}, "code"},
		{"event without time", &JobEvent{JobID: "j", Seq: 1, State: StateQueued}, "time"},
		{"failed event without error", &JobEvent{JobID: "j", Seq: 1, State: StateFailed, Time: when}, "error"},
		{"event with wildcard id", &JobEvent{JobID: "j.*", Seq: 1, State: StateQueued, Time: when}, "only letters"},
		{"token without reason", &TokenMsg{JobID: "j", Index: 1, TokenID: 1, Final: true}, "finish_reason"},
		{"decode worker without layers", &WorkerInfo{ID: "w", Kind: KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 1, Time: when}, "layers"},
		{"worker with more free than total", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", MemoryTotal: 1, MemoryFree: 2, Time: when}, "memory_free"},
		{"worker with bad endpoint", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when, Endpoints: Endpoints{Metrics: "nohost"}}, "endpoints.metrics"},
		{"prefill store prefix off the grid", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when,
			PrefixCache: &PrefixCacheInfo{Prefixes: []CachedPrefix{{Link: 1, Tokens: 65}}}}, "prefixes[0].tokens"},
		{"cached prefix off the block grid", &WorkerInfo{ID: "w", Kind: KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 1, Layers: LayerRange{First: 0, End: 1}, Time: when,
			PrefixCache: &PrefixCacheInfo{Prefixes: []CachedPrefix{{Link: 1, Tokens: 100}}}}, "prefixes[0].tokens"},
		{"snapshot stride off the block grid", &WorkerInfo{ID: "w", Kind: KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 1, Layers: LayerRange{First: 0, End: 1}, Time: when,
			PrefixCache: &PrefixCacheInfo{Stride: 100}}, "prefix_cache.stride"},
		{"too many cached prefixes", &WorkerInfo{ID: "w", Kind: KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 1, Layers: LayerRange{First: 0, End: 1}, Time: when,
			PrefixCache: &PrefixCacheInfo{Prefixes: make([]CachedPrefix, MaxCachedPrefixes+1)}}, "at most"},
		{"worker with negative prefill chunk", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when, PrefillChunk: -1}, "prefill_chunk"},
		{"worker with NaN rate", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when, Rates: Rates{DecodeTokensPerSec: math.NaN()}}, "decode_tok_s"},
		{"worker with negative read rate", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when, Rates: Rates{ReadBytesPerSec: -1}}, "rates.read_bytes_s"},
		{"worker with infinite attention term", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when,
			Rates: Rates{Compute: &ComputeTerms{KDA: 1, Attn: math.Inf(1)}}}, "rates.compute.attn_gflops"},
		{"worker with negative layer cost", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when,
			Rates: Rates{Compute: &ComputeTerms{Layer: -1}}}, "rates.compute.layer_ns"},
		{"progress with negative samples", &Progress{JobID: "j", WorkerID: "w", Stage: StateDone, Time: when,
			Measured: &Rates{Compute: &ComputeTerms{Samples: -2}}}, "measured.compute.samples"},
		{"placement with a gap", func() Message {
			a := *ok[15].(*Assignment)
			a.Placement = append([]LayerPlacement(nil), a.Placement...)
			a.Placement[1].Layers.First = 31
			return &a
		}(), "tile"},
		{"tensor rank missing", func() Message {
			a := tensorAssignment()
			a.Placement = a.Placement[:3]
			return a
		}(), "has 3 ranks, not whole stages of tensor_ranks 2: the last stage lacks tensor rank(s) 1..1"},
		{"tensor ranks mixed", func() Message {
			a := tensorAssignment()
			a.Placement[3].TensorRanks = 4
			return a
		}(), "placement[3].tensor_ranks: is 4, rank 0's 2"},
		{"tensor rank out of order", func() Message {
			a := tensorAssignment()
			a.Placement[2].TensorRank = 1
			return a
		}(), "placement[2].tensor_rank: is 1 at rank 2 with tensor_ranks 2"},
		{"tensor rank without size", func() Message {
			a := tensorAssignment()
			for i := range a.Placement {
				a.Placement[i].TensorRanks = 0
			}
			return a
		}(), "placement[1].tensor_rank: is 1 with tensor_ranks 0"},
		{"stage on other layers", func() Message {
			a := tensorAssignment()
			a.Placement[1].Layers = LayerRange{0, 29}
			return a
		}(), "its stage's tensor rank 0 (rank 0) holds [0,30)"},
		{"worker tensor rank past its size", &WorkerInfo{ID: "w", Kind: KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 2, Rank: 1, TensorRank: 2, TensorRanks: 2,
			Layers: LayerRange{First: 0, End: 1}, Time: when}, "tensor_rank: is 2 with tensor_ranks 2"},
		{"worker tensor size not dividing the group", &WorkerInfo{ID: "w", Kind: KindDecode, Backend: "cpu", GroupID: "g", GroupSize: 3, Rank: 1, TensorRank: 1, TensorRanks: 2,
			Layers: LayerRange{First: 0, End: 1}, Time: when}, "does not divide group_size 3"},
		{"prefill worker with a tensor rank", &WorkerInfo{ID: "w", Kind: KindPrefill, Backend: "cpu", Time: when, TensorRanks: 2}, "no decode group"},
		{"prefill without secrets", func() Message {
			a := ok[15].(*Assignment).ForWorker("mac-0")
			a.Role, a.WorkerID = RolePrefill, "gpu-0"
			return &a
		}(), "secret"},
		{"short secret", func() Message {
			a := *ok[15].(*Assignment)
			a.Placement = append([]LayerPlacement(nil), a.Placement...)
			a.Placement[0].Secret = []byte{1}
			return &a
		}(), "secret"},
		{"append base off the grid", func() Message {
			a := ok[15].(*Assignment).ForWorker("mac-0")
			a.TokenIDs, a.CachedTokens, a.CachedTokenIDs, a.AppendTokens = []int32{1}, 128, make([]int32, 128), 100
			return &a
		}(), "append_tokens"},
		{"append base without the cached tokens", func() Message {
			a := ok[15].(*Assignment).ForWorker("mac-0")
			a.TokenIDs, a.CachedTokens, a.AppendTokens = []int32{1}, 128, 64
			return &a
		}(), "append_tokens"},
		{"append base past the prefill", func() Message {
			a := *ok[15].(*Assignment)
			a.AppendTokens = 64 // two tokens to prefill
			return &a
		}(), "append_tokens"},
		{"cached tokens of another length", func() Message {
			a := ok[15].(*Assignment).ForWorker("mac-0")
			a.TokenIDs, a.CachedTokens, a.CachedTokenIDs = []int32{1}, 128, make([]int32, 127)
			return &a
		}(), "cached_token_ids"},
		{"refusal without reason", &AssignReply{JobID: "j", WorkerID: "w"}, "error"},
		{"failed progress without error", &Progress{JobID: "j", WorkerID: "w", Stage: StateFailed, Time: when}, "error"},
		{"availability without a model", &AvailabilityReply{DecodeGroups: 1, DecodeRanks: 1}, "model"},
		{"availability with more groups than ranks", &AvailabilityReply{Model: "k3", DecodeGroups: 2, DecodeRanks: 1}, "decode_ranks"},
		{"availability with negative capacity", &AvailabilityReply{Model: "k3", MaxTokens: -1}, "max_tokens"},
		{"cache list with a key", &CacheRequest{WorkerID: "w", Op: CacheList, Key: "7"}, "key"},
		{"cache drop naming nothing", &CacheRequest{WorkerID: "w", Op: CacheDrop}, "not neither"},
		{"cache drop naming a key and all", &CacheRequest{WorkerID: "w", Op: CacheDrop, Key: "7", All: true}, "not both"},
		{"cache drop of a wildcard key", &CacheRequest{WorkerID: "w", Op: CacheDrop, Key: "*"}, "only letters"},
		{"cache request of an unknown op", &CacheRequest{WorkerID: "w", Op: "purge"}, "op"},
		{"cache request to a wildcard worker", &CacheRequest{WorkerID: "w.>", Op: CacheList}, "worker_id"},
		{"cache reply of an unknown kind", &CacheReply{WorkerID: "w", Kind: "gpu"}, "kind"},
		{"cache reply of a prefill worker in a group", &CacheReply{WorkerID: "w", Kind: KindPrefill, GroupID: "g"}, "group_id"},
		{"cache reply of an unknown dtype", &CacheReply{WorkerID: "w", Kind: KindPrefill, CacheDType: "fp8"}, "cache_dtype"},
		{"cache reply listing more than its total", &CacheReply{WorkerID: "w", Kind: KindPrefill, Total: 0,
			Entries: []CacheEntry{{Key: "k", Tokens: 64, LastUse: when}}}, "more than total"},
		{"cache reply listing too many", &CacheReply{WorkerID: "w", Kind: KindPrefill, Total: MaxCacheEntries + 1,
			Entries: make([]CacheEntry, MaxCacheEntries+1)}, "at most"},
		{"cache entry off the grid", &CacheReply{WorkerID: "w", Kind: KindPrefill, Total: 1,
			Entries: []CacheEntry{{Key: "k", Tokens: 100, LastUse: when}}}, "entries[0].tokens"},
		{"cache entry with a bad prefix", &CacheReply{WorkerID: "w", Kind: KindPrefill, Total: 1,
			Entries: []CacheEntry{{Key: "k", Prefix: "XYZ", Tokens: 64, LastUse: when}}}, "entries[0].prefix"},
		{"cache entry with more snapshots than blocks", &CacheReply{WorkerID: "w", Kind: KindDecode, GroupID: "g", Total: 1,
			Entries: []CacheEntry{{Key: "k", Tokens: 64, Snapshots: 2, LastUse: when}}}, "entries[0].snapshots"},
		{"cache entry without a time", &CacheReply{WorkerID: "w", Kind: KindPrefill, Total: 1,
			Entries: []CacheEntry{{Key: "k", Tokens: 64}}}, "entries[0].last_use"},
		{"cache reply off with entries", &CacheReply{WorkerID: "w", Kind: KindPrefill, Off: true, Total: 1}, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate: %v; want an ErrInvalid error mentioning %q", err, tc.want)
			}
		})
	}
}

// A decode rank gets only its own transfer secret.
func TestAssignmentForWorker(t *testing.T) {
	a := sampleMessages()[15].(*Assignment)
	b := a.ForWorker("mac-1")
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if b.Role != RoleDecode || b.WorkerID != "mac-1" {
		t.Fatalf("role %s worker %s", b.Role, b.WorkerID)
	}
	if b.Placement[0].Secret != nil || !reflect.DeepEqual(b.Placement[1].Secret, a.Placement[1].Secret) {
		t.Fatalf("secrets: rank 0 %x, rank 1 %x; want none and rank 1's own", b.Placement[0].Secret, b.Placement[1].Secret)
	}
	if a.Placement[0].Secret == nil {
		t.Fatal("ForWorker changed the original")
	}
	if c := a.ForWorker("stranger"); c.Validate() == nil {
		t.Fatal("an assignment for a worker outside the placement validated")
	}
}

func TestParseContentType(t *testing.T) {
	for ct, want := range map[string]Encoding{
		"": MsgPack, "application/msgpack": MsgPack, "application/json": JSON,
		"application/json; charset=utf-8": JSON, "Application/JSON": JSON, "application/x-msgpack": MsgPack,
	} {
		got, err := ParseContentType(ct)
		if err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", ct, got, err, want)
		}
	}
	for _, ct := range []string{"text/plain", "application/xml", ";;"} {
		if _, err := ParseContentType(ct); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", ct, err)
		}
	}
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewJobID()
		if err := CheckID(id); err != nil || seen[id] {
			t.Fatalf("NewJobID %q: %v (repeat %v)", id, err, seen[id])
		}
		seen[id] = true
	}
	if JobIDForKey("c", "a") != JobIDForKey("c", "a") || JobIDForKey("c", "a") == JobIDForKey("c", "b") {
		t.Fatal("JobIDForKey is not a function of the key")
	}
	// Two clients' keys never meet, even when they are the same text.
	if JobIDForKey("alice", "a") == JobIDForKey("bob", "a") {
		t.Fatal("JobIDForKey does not tell clients apart")
	}
	if err := CheckID(JobIDForKey("c", "x")); err != nil {
		t.Fatal(err)
	}
	if err := CheckID(NewSessionID()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a.b", "a*", ">", "a b", strings.Repeat("a", MaxIDLen+1), "é"} {
		if CheckID(bad) == nil {
			t.Errorf("CheckID(%q) accepted", bad)
		}
	}
	if s := NewSecret(); len(s) != SecretSize || reflect.DeepEqual(s, NewSecret()) {
		t.Fatal("NewSecret: wrong size or not random")
	}
}

func TestSubjects(t *testing.T) {
	for got, want := range map[string]string{
		ClientJobEvents("c", "j-1"):  "tandem.v1.clients.c.jobs.j-1.events",
		ClientJobTokens("c", "j-1"):  "tandem.v1.clients.c.jobs.j-1.tokens",
		WorkerProgress("w-1", "j-1"): "tandem.v1.workers.w-1.jobs.j-1.progress",
		WorkerAssign("w-1"):          "tandem.v1.workers.w-1.assign",
		WorkerCancel("w-1"):          "tandem.v1.workers.w-1.cancel",
		WorkerCache("w-1"):           "tandem.v1.workers.w-1.cache",
		HeartbeatSubject("w-1"):      "$KV.tandem-v1-workers.w-1",
		ClientSubmit("c"):            "tandem.v1.clients.c.submit",
		ClientCancel("c"):            "tandem.v1.clients.c.cancel",
		ClientList("c"):              "tandem.v1.clients.c.list",
	} {
		if got != want {
			t.Errorf("subject %s, want %s", got, want)
		}
	}
	if c, err := ClientOf(ClientCancel("c-1")); err != nil || c != "c-1" {
		t.Errorf("ClientOf(%s) = %q, %v", ClientCancel("c-1"), c, err)
	}
	for _, bad := range []string{"tandem.v1.clients.c.jobs", "tandem.v1.clients.c", "tandem.v1.jobs.submit", "tandem.v1.clients..submit", "x.tandem.v1.clients.c.submit"} {
		if c, err := ClientOf(bad); err == nil {
			t.Errorf("ClientOf(%q) = %q, want an error", bad, c)
		}
	}
	if w, j, err := ProgressSender(WorkerProgress("w-1", "j-1")); err != nil || w != "w-1" || j != "j-1" {
		t.Errorf("ProgressSender = %q, %q, %v", w, j, err)
	}
	for _, bad := range []string{"tandem.v1.jobs.j-1.progress", "tandem.v1.workers.w.jobs.j.events", "tandem.v2.workers.w.jobs.j.progress"} {
		if _, _, err := ProgressSender(bad); err == nil {
			t.Errorf("ProgressSender(%q) accepted", bad)
		}
	}
}

// TestRefusalOfAnUnnamedRequestIsValid: a worker refusing a request too
// malformed to name its job can still answer.
func TestRefusalOfAnUnnamedRequestIsValid(t *testing.T) {
	var r AssignReply
	r.SetError(CodeBadRequest, "invalid message: Assignment (msgpack): malformed")
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (&AssignReply{Accepted: true}).Validate(); err == nil {
		t.Fatal("an acceptance without ids validates")
	}
}

// TestSniff: without a Content-Type header, a payload is JSON exactly when
// its first byte after JSON white space is '{', which no msgpack message
// (a map) can start with.
func TestSniff(t *testing.T) {
	for _, c := range []struct {
		data string
		want Encoding
	}{
		{`{"prompt":"x"}`, JSON},
		{" \t\r\n{}", JSON},
		{"", MsgPack},
		{"   ", MsgPack},
		{"[1]", MsgPack},
		{"\x81\xa6prompt\xa1x", MsgPack},
		{"\xde\x00\x01", MsgPack},
		{" \x81", MsgPack},
	} {
		if got := Sniff([]byte(c.data)); got != c.want {
			t.Errorf("Sniff(%q) = %s, want %s", c.data, got, c.want)
		}
	}
	// Every byte a msgpack map can start with is not '{' or white space.
	for b := 0x80; b <= 0x8f; b++ {
		if Sniff([]byte{byte(b)}) != MsgPack {
			t.Fatalf("fixmap 0x%02x sniffed as JSON", b)
		}
	}
}
