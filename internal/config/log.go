package config

import (
	"fmt"
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// LogSettings are the logger's settings, the same on every binary.
var LogSettings = []Setting{
	{Key: "log.level", Default: "info", Help: "log level: debug, info, warn or error"},
	{Key: "log.format", Default: "console", Help: "log format: console (for people) or json (one object a line)"},
}

// NewLogger is the logger every binary uses: level and format as
// LogSettings take them, timestamps in ISO 8601, written to w. A key
// appears once in a line: a field given again (by a child logger or
// the call) replaces the earlier value in its place.
func NewLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("log.format %q: want console or json", format)
	}
	return zap.New(&uniqueCore{Core: zapcore.NewCore(enc, zapcore.AddSync(w), lvl)}), nil
}

// uniqueCore keeps the fields of With itself and hands the inner core
// each entry's fields with every key once.
type uniqueCore struct {
	zapcore.Core
	fields []zapcore.Field
}

func (c *uniqueCore) With(fs []zapcore.Field) zapcore.Core {
	return &uniqueCore{Core: c.Core, fields: merge(c.fields, fs)}
}

func (c *uniqueCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *uniqueCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	return c.Core.Write(e, merge(c.fields, fs))
}

// merge is a then b, a key given again replacing its earlier value in
// place. After a namespace (zap.Namespace) keys belong to it, so from
// there on nothing is merged.
func merge(a, b []zapcore.Field) []zapcore.Field {
	if len(b) == 0 {
		return a
	}
	out := make([]zapcore.Field, len(a), len(a)+len(b))
	copy(out, a)
	nested := false
	for _, f := range out {
		nested = nested || f.Type == zapcore.NamespaceType
	}
next:
	for _, f := range b {
		if !nested && f.Type != zapcore.NamespaceType && f.Type != zapcore.SkipType {
			for i := range out {
				if out[i].Key == f.Key && out[i].Type != zapcore.NamespaceType {
					out[i] = f
					continue next
				}
			}
		}
		nested = nested || f.Type == zapcore.NamespaceType
		out = append(out, f)
	}
	return out
}
