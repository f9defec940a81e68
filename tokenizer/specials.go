package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// NumSpecial is the number of special-token slots after the ranks.
const NumSpecial = 256

// Names of the K3 special tokens that the framing and the decode loop use.
const (
	BOS          = "[BOS]"
	EOS          = "[EOS]"
	EndOfMsg     = "<|end_of_msg|>"
	Open         = "<|open|>"
	Close        = "<|close|>"
	Sep          = "<|sep|>"
	MediaBegin   = "<|media_begin|>"
	MediaContent = "<|media_content|>"
	MediaEnd     = "<|media_end|>"
	MediaPad     = "<|media_pad|>"
	UNK          = "[UNK]"
	PAD          = "[PAD]"
)

// k3Specials are the known K3 special tokens by offset from the first
// special id (163584 in the released vocabulary, K3-SPEC section 6).
var k3Specials = []struct {
	offset int
	name   string
}{
	{0, BOS}, {1, EOS}, {2, EndOfMsg}, {3, Open}, {4, Close}, {5, Sep},
	{6, "[start_header_id]"}, {7, "[end_header_id]"}, {9, "[EOT]"},
	{18, MediaBegin}, {19, MediaContent}, {20, MediaEnd}, {21, MediaPad},
	{65, "<osagent_mode>"}, {254, UNK}, {255, PAD},
}

// reservedName is the name of an unnamed special slot.
func reservedName(id int) string { return "<|reserved_token_" + strconv.Itoa(id) + "|>" }

// addedToken is one entry of tokenizer_config.json's added_tokens_decoder.
type addedToken struct {
	Content    string `json:"content"`
	LStrip     bool   `json:"lstrip"`
	Normalized bool   `json:"normalized"`
	RStrip     bool   `json:"rstrip"`
	SingleWord bool   `json:"single_word"`
	Special    bool   `json:"special"`
}

// parseSpecials reads the special-token names from a tokenizer_config.json
// for a vocabulary of numRanks ranks: slots numRanks..numRanks+255, named by
// added_tokens_decoder where it names them, <|reserved_token_ID|> otherwise.
// name labels errors.
func parseSpecials(data []byte, numRanks int, name string) ([]string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	names := make([]string, NumSpecial)
	if raw, ok := top["added_tokens_decoder"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		// Walk the object by hand: json.Unmarshal into a map would keep the
		// last of two entries with the same id silently.
		dec := json.NewDecoder(bytes.NewReader(raw))
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return nil, fmt.Errorf("%s: added_tokens_decoder is not an object", name)
		}
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("%s: added_tokens_decoder: %w", name, err)
			}
			key := t.(string) // object keys are strings
			var at addedToken
			if err := dec.Decode(&at); err != nil {
				return nil, fmt.Errorf("%s: added_tokens_decoder[%q]: %w", name, key, err)
			}
			id, err := strconv.Atoi(key)
			if err != nil {
				return nil, fmt.Errorf("%s: added_tokens_decoder key %q is not a token id", name, key)
			}
			if id < numRanks || id >= numRanks+NumSpecial {
				return nil, fmt.Errorf("%s: added token %q has id %d outside the special range %d..%d (the rank file has %d ranks)",
					name, at.Content, id, numRanks, numRanks+NumSpecial-1, numRanks)
			}
			if at.Content == "" {
				return nil, fmt.Errorf("%s: added token %d has no content", name, id)
			}
			if names[id-numRanks] != "" {
				return nil, fmt.Errorf("%s: added token id %d appears twice (%q and %q)", name, id, names[id-numRanks], at.Content)
			}
			names[id-numRanks] = at.Content
		}
	}
	seen := make(map[string]int, NumSpecial)
	for i := range names {
		id := numRanks + i
		if names[i] == "" {
			names[i] = reservedName(id)
		}
		if prev, dup := seen[names[i]]; dup {
			return nil, fmt.Errorf("%s: special token %q names both id %d and id %d", name, names[i], prev, id)
		}
		seen[names[i]] = id
	}
	return names, nil
}

// syntheticConfig renders a tokenizer_config.json whose added_tokens_decoder
// holds the known K3 specials at their K3 offsets above numRanks.
func syntheticConfig(numRanks int) ([]byte, error) {
	decoder := make(map[string]addedToken, len(k3Specials))
	for _, s := range k3Specials {
		decoder[strconv.Itoa(numRanks+s.offset)] = addedToken{Content: s.name, Special: true}
	}
	cfg := map[string]any{
		"added_tokens_decoder": decoder,
		"bos_token":            BOS,
		"eos_token":            EOS,
		"pad_token":            PAD,
		"unk_token":            UNK,
		"model_max_length":     1048576,
		"tokenizer_class":      "TikTokenTokenizer",
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
