package main

import (
	"fmt"
	"os"

	"github.com/tandem-inference/tandem/tokenizer"
)

// reportTokenizer says whether mkmodel's output has a tokenizer: synth
// writes one (byte-level BPE learned from the bundled corpus, K3's specials
// at the top of the vocabulary) when the vocabulary can hold it.
func reportTokenizer(vocab int) {
	if vocab < tokenizer.MinSyntheticVocab {
		fmt.Fprintf(os.Stderr, "mkmodel: no tokenizer written: a vocabulary of %d ids cannot hold 256 byte tokens, %d specials and some merges (need at least %d); use token ids with this model\n",
			vocab, tokenizer.NumSpecial, tokenizer.MinSyntheticVocab)
		return
	}
	fmt.Fprintf(os.Stderr, "mkmodel: wrote tiktoken.model and tokenizer_config.json (%d ids, specials at %d..%d)\n", vocab, vocab-tokenizer.NumSpecial, vocab-1)
}
