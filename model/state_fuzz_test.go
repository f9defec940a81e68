package model

import (
	"bytes"
	"testing"
)

// FuzzDecodeState: hostile encodings never panic, and whatever decodes
// re-encodes to the same bytes.
func FuzzDecodeState(f *testing.F) {
	c, err := ParseConfig([]byte(fixtureConfig))
	if err != nil {
		f.Fatal(err)
	}
	s := c.NewSeqState(0, c.NumLayers, StateOptions{LatentDType: BF16})
	for _, ls := range s.Layers {
		if ls.Kind == MLA {
			growLatent(&ls.Parts[0], 2, c.LatentWidth())
		}
	}
	s.Tokens = 2
	enc, err := s.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(enc)
	f.Add(enc[:len(enc)/2])
	f.Add([]byte("K3ST"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s SeqState
		if err := s.UnmarshalBinary(b); err != nil {
			return
		}
		out, err := s.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded state does not re-encode: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatal("decode/encode is not the identity")
		}
	})
}
