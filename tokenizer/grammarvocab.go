package tokenizer

import (
	"fmt"

	"github.com/tandem-inference/tandem/grammar"
)

// TokenBytes returns the bytes of ordinary token id, or nil for a special
// token or an id outside the vocabulary.
func (t *Tokenizer) TokenBytes(id int) []byte {
	if id < 0 || id >= t.v.len() {
		return nil
	}
	return []byte(t.v.bytes(id))
}

// GrammarVocabulary returns the tokenizer's ids as grammar reads them:
// ordinary tokens by their bytes, K3's markers as markers, other special
// tokens never allowed. Build it once per tokenizer.
func (t *Tokenizer) GrammarVocabulary() (*grammar.Vocabulary, error) {
	var m grammar.Markers
	for name, dst := range map[string]*int{Open: &m.Open, Close: &m.Close, Sep: &m.Sep, EndOfMsg: &m.EndOfMsg} {
		id, ok := t.SpecialID(name)
		if !ok {
			return nil, fmt.Errorf("tokenizer: no special %s for a grammar", name)
		}
		*dst = id
	}
	return grammar.NewVocabulary(t.VocabSize(), t.TokenBytes, m)
}
