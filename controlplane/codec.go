package controlplane

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"reflect"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/tandem-inference/tandem/internal/msgpackscan"
)

// Message is a control-plane message: it can check itself.
type Message interface {
	Validate() error
}

// Encoding is a wire encoding of messages.
type Encoding uint8

const (
	// MsgPack is the default encoding.
	MsgPack Encoding = iota
	// JSON is used when a request carries Content-Type: application/json;
	// the reply is then JSON too.
	JSON
)

// Content types and the header that carries them.
const (
	HeaderContentType  = "Content-Type"
	ContentTypeJSON    = "application/json"
	ContentTypeMsgPack = "application/msgpack"
)

// MaxMessageSize is the largest message a decoder accepts. The NATS
// server's max_payload must be at least the largest prompt's encoding (a
// 1M-token prompt is about 5 MiB of msgpack); the embedded server uses 8 MiB.
const MaxMessageSize = 16 << 20

func (e Encoding) String() string {
	if e == JSON {
		return "json"
	}
	return "msgpack"
}

// EncodingNamed is the encoding a message field names: "" or "msgpack",
// or "json".
func EncodingNamed(name string) (Encoding, error) {
	switch name {
	case "", "msgpack":
		return MsgPack, nil
	case "json":
		return JSON, nil
	}
	return MsgPack, fmt.Errorf("is %q, want msgpack or json", name)
}

// Field is e as a message field gives it: "" for msgpack (the default,
// left out), "json".
func (e Encoding) Field() string {
	if e == JSON {
		return "json"
	}
	return ""
}

// ContentType is the Content-Type header value for e.
func (e Encoding) ContentType() string {
	if e == JSON {
		return ContentTypeJSON
	}
	return ContentTypeMsgPack
}

// ParseContentType maps a Content-Type header value to an encoding: empty or
// a msgpack type means MsgPack, application/json (with any parameters)
// means JSON, anything else is an error that names what is accepted.
func ParseContentType(ct string) (Encoding, error) {
	if strings.TrimSpace(ct) == "" {
		return MsgPack, nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return MsgPack, fmt.Errorf("%w: Content-Type %q: %v", ErrInvalid, ct, err)
	}
	switch mt {
	case ContentTypeJSON:
		return JSON, nil
	case ContentTypeMsgPack, "application/x-msgpack", "application/vnd.msgpack":
		return MsgPack, nil
	}
	return MsgPack, fmt.Errorf("%w: Content-Type %q is not supported: use %s or %s", ErrInvalid, ct, ContentTypeJSON, ContentTypeMsgPack)
}

// errDecoderPanic marks an error made from a decoder's panic, so tests and
// fuzzing can tell a caught panic from an ordinary rejection.
var errDecoderPanic = errors.New("decoder panic")

// Marshal encodes v.
func Marshal(enc Encoding, v any) ([]byte, error) {
	if enc == JSON {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode %T as json: %w", v, err)
		}
		return b, nil
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		return nil, fmt.Errorf("encode %T as msgpack: %w", v, err)
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes data into m strictly, then validates it. An unknown
// field, a field of the wrong type, trailing bytes or an invalid value is an
// error wrapping ErrInvalid that names the message and the field. It never
// panics, whatever data holds.
func Unmarshal(enc Encoding, data []byte, m Message) (err error) {
	name := typeName(m)
	if len(data) > MaxMessageSize {
		return fmt.Errorf("%w: %s (%s) is %d bytes, at most %d accepted", ErrInvalid, name, enc, len(data), MaxMessageSize)
	}
	rv := reflect.ValueOf(m)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("controlplane.Unmarshal: want a non-nil pointer to a struct, got %T", m)
	}
	rv.Elem().SetZero()
	defer func() {
		// The decoders are not ours; a panic on hostile input must still
		// become an error, not a crash.
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s (%s): undecodable input: %w: %v", ErrInvalid, name, enc, errDecoderPanic, p)
		}
	}()
	if enc == JSON {
		err = decodeJSON(data, m, name)
	} else {
		err = decodeMsgpack(data, m, name)
	}
	if err != nil {
		return err
	}
	return m.Validate()
}

func decodeJSON(data []byte, m Message, name string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return fmt.Errorf("%w: %s (json): %s", ErrInvalid, name, explainJSON(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: %s (json): trailing data after the object at byte %d", ErrInvalid, name, dec.InputOffset())
	}
	return nil
}

func explainJSON(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var b64 base64.CorruptInputError
	switch {
	case errors.As(err, &b64):
		return fmt.Sprintf("a binary field (images) is not valid base64: illegal data at its byte %d", int64(b64))
	case errors.Is(err, io.EOF):
		return "empty input, want a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "input ends in the middle of the JSON object"
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("got a JSON %s, want an object", typ.Value)
		}
		return fmt.Sprintf("field %q: got a JSON %s, want %s", wirePath(typ.Field), typ.Value, typ.Type)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// wirePath drops Go names of embedded structs ("Sampling.max_tokens") from
// a JSON field path: wire names are all lower case.
func wirePath(p string) string {
	parts := strings.Split(p, ".")
	out := parts[:0]
	for _, s := range parts {
		if s != "" && !(s[0] >= 'A' && s[0] <= 'Z') {
			out = append(out, s)
		}
	}
	return strings.Join(out, ".")
}

func decodeMsgpack(data []byte, m Message, name string) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: %s (msgpack): empty input, want a map", ErrInvalid, name)
	}
	if c := data[0]; !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return fmt.Errorf("%w: %s (msgpack): got a %s, want a map (is the request JSON without Content-Type: application/json?)", ErrInvalid, name, msgpackKind(c))
	}
	if err := msgpackscan.CheckFor(data, reflect.TypeOf(m).Elem()); err != nil {
		return fmt.Errorf("%w: %s (msgpack): %v", ErrInvalid, name, err)
	}
	r := bytes.NewReader(data)
	dec := msgpack.NewDecoder(r)
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(m); err != nil {
		return fmt.Errorf("%w: %s (msgpack): %s", ErrInvalid, name, explainMsgpack(data, reflect.TypeOf(m).Elem(), err))
	}
	if r.Len() != 0 {
		return fmt.Errorf("%w: %s (msgpack): %d trailing bytes after the map", ErrInvalid, name, r.Len())
	}
	return nil
}

// explainMsgpack finds which field failed to decode: the msgpack library's
// errors do not say. It re-reads the map key by key, on the error path only.
func explainMsgpack(data []byte, typ reflect.Type, cause error) string {
	if path, why := locateMsgpack(data, typ, 0); path != "" {
		return path + ": " + why
	}
	return strings.TrimPrefix(cause.Error(), "msgpack: ")
}

func locateMsgpack(data []byte, typ reflect.Type, depth int) (path, why string) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if depth > 8 {
		return "", ""
	}
	switch typ.Kind() {
	case reflect.Struct:
		if reflect.PointerTo(typ).Implements(msgpackDecoderType) || typ.PkgPath() == "time" {
			return "", ""
		}
		var raw map[string]msgpack.RawMessage
		if err := msgpack.Unmarshal(data, &raw); err != nil {
			return "", ""
		}
		fields := msgpackscan.Fields(typ)
		for key, val := range raw {
			ft, ok := fields[key]
			if !ok {
				return fmt.Sprintf("%q", key), "unknown field"
			}
			if err := unmarshalStrict(val, ft); err != nil {
				if p, w := locateMsgpack(val, ft, depth+1); p != "" {
					return key + joinPath(p), w
				}
				return key, fmt.Sprintf("got a msgpack %s, want %s: %s", msgpackKind(val[0]), ft, strings.TrimPrefix(err.Error(), "msgpack: "))
			}
		}
	case reflect.Slice:
		if typ.Elem().Kind() == reflect.Uint8 {
			return "", ""
		}
		var raw []msgpack.RawMessage
		if err := msgpack.Unmarshal(data, &raw); err != nil {
			return "", ""
		}
		for i, val := range raw {
			if err := unmarshalStrict(val, typ.Elem()); err != nil {
				if p, w := locateMsgpack(val, typ.Elem(), depth+1); p != "" {
					return fmt.Sprintf("[%d]%s", i, joinPath(p)), w
				}
				return fmt.Sprintf("[%d]", i), fmt.Sprintf("got a msgpack %s, want %s: %s", msgpackKind(val[0]), typ.Elem(), strings.TrimPrefix(err.Error(), "msgpack: "))
			}
		}
	}
	return "", ""
}

func joinPath(p string) string {
	if strings.HasPrefix(p, "[") {
		return p
	}
	return "." + p
}

var msgpackDecoderType = reflect.TypeFor[msgpack.CustomDecoder]()

func unmarshalStrict(data []byte, typ reflect.Type) error {
	if len(data) == 0 {
		return errors.New("empty value")
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields(true)
	return dec.DecodeValue(reflect.New(typ).Elem())
}

func msgpackKind(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	case msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		return "integer"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case msgpcode.IsString(c):
		return "string"
	case msgpcode.IsBin(c):
		return "binary"
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return "array"
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return "map"
	case msgpcode.IsExt(c):
		return "extension"
	}
	return fmt.Sprintf("value with code 0x%02x", c)
}

func typeName(m any) string {
	t := reflect.TypeOf(m)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "<nil>"
	}
	return t.Name()
}
