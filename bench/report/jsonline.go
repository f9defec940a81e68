package report

import (
	"encoding/json"
	"fmt"
	"io"
)

// JSONLine writes v as one JSON object on one line: the last line of a
// bench command's output with --json, for scripts to read.
func JSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("report: encoding the JSON line: %w", err)
	}
	if len(b) == 0 || b[0] != '{' {
		return fmt.Errorf("report: the JSON line must be an object, got %.20s", b)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
