package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/tandem-inference/tandem/tokenizer"
)

// writeTokenizer adds a synthetic tokenizer (byte-level BPE learned from
// the bundled corpus, K3's specials at the top of the vocabulary) to a
// generated model when its vocabulary can hold one, and says so otherwise.
func writeTokenizer(dir string, vocab int) error {
	err := tokenizer.WriteSynthetic(dir, vocab, tokenizer.DefaultCorpus())
	if errors.Is(err, tokenizer.ErrVocabTooSmall) {
		fmt.Fprintf(os.Stderr, "mkmodel: no tokenizer written: %v (use token ids with this model)\n", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("synthetic tokenizer: %w", err)
	}
	fmt.Fprintf(os.Stderr, "mkmodel: wrote tiktoken.model and tokenizer_config.json (%d ids)\n", vocab)
	return nil
}
