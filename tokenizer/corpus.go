package tokenizer

import _ "embed"

// corpus is a short text written for this package: English prose, code,
// numbers and a few paragraphs in other scripts, with CRLF lines, tabs and
// emoji, so that merges learned from it cover what the tests throw at them.
//
//go:embed corpus.txt
var corpus []byte

// DefaultCorpus returns the bundled training text for WriteSynthetic.
func DefaultCorpus() []byte { return append([]byte(nil), corpus...) }
