package controlplane

import (
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/grammar"
)

func TestSamplingGrammarValidated(t *testing.T) {
	for _, tc := range []struct {
		spec grammar.Spec
		want string
	}{
		{grammar.Spec{Mode: "xml"}, "mode"},
		{grammar.Spec{Mode: grammar.ModeToolCall}, "needs tools"},
		{grammar.Spec{Mode: grammar.ModeJSONObject, ThinkBudget: -1}, "negative"},
	} {
		r := &SubmitRequest{Prompt: "hi", Sampling: Sampling{Grammar: &tc.spec}}
		err := r.Validate()
		var fe *FieldError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !asField(err, &fe) || fe.Field != "grammar" {
			t.Errorf("%+v: Validate = %v, want a grammar field error with %q", tc.spec, err, tc.want)
		}
	}
}

func asField(err error, fe **FieldError) bool {
	f, ok := err.(*FieldError)
	*fe = f
	return ok
}
