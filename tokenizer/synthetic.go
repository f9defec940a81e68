package tokenizer

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// MinSyntheticVocab is the smallest vocabulary WriteSynthetic accepts: the
// 256 byte tokens, the 256 special slots and 64 merges.
const MinSyntheticVocab = 256 + NumSpecial + 64

// ErrVocabTooSmall reports a vocabulary that cannot hold a tokenizer.
var ErrVocabTooSmall = errors.New("tokenizer: vocabulary too small")

// WriteSynthetic writes a tokenizer for a vocabulary of vocabSize ids into
// dir: tiktoken.model with vocabSize-256 ranks (the 256 bytes, merges learned
// from corpus, then, when the corpus runs out of pairs, concatenations of
// earlier tokens, so that every id below vocabSize decodes) and
// tokenizer_config.json naming the K3 specials at their K3 offsets in the
// last 256 ids ([BOS] = vocabSize-256, [EOS] = vocabSize-255,
// <|end_of_msg|> = vocabSize-254, ...). An empty corpus means
// DefaultCorpus. The files depend only on vocabSize and corpus.
func WriteSynthetic(dir string, vocabSize int, corpus []byte) error {
	if vocabSize < MinSyntheticVocab {
		return fmt.Errorf("%w: %d ids cannot hold 256 byte tokens, %d specials and 64 merges; need at least %d",
			ErrVocabTooSmall, vocabSize, NumSpecial, MinSyntheticVocab)
	}
	if len(corpus) == 0 {
		corpus = DefaultCorpus()
	}
	numRanks := vocabSize - NumSpecial
	tokens := trainRanks(string(corpus), numRanks)
	model := make([]byte, 0, numRanks*16)
	for r, tok := range tokens {
		model = base64.StdEncoding.AppendEncode(model, tok)
		model = append(model, ' ')
		model = strconv.AppendInt(model, int64(r), 10)
		model = append(model, '\n')
	}
	config, err := syntheticConfig(numRanks)
	if err != nil {
		return fmt.Errorf("tokenizer: synthetic config: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, ModelFile), model); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ConfigFile), config)
}

// writeFileAtomic writes data to a temporary file beside path and renames it
// into place, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("tokenizer: write %s: %w", path, err)
	}
	return nil
}
