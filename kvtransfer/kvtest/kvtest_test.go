package kvtest

import (
	"testing"

	"github.com/tandem-inference/tandem/model"
)

func TestConfigs(t *testing.T) {
	for _, tc := range []struct {
		name        string
		layers, mla int
		latent      int
	}{{"tiny", 9, 3, 40}, {"small", 17, 5, 160}, {"k3", 93, 24, 576}} {
		c, err := Config(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if c.NumLayers != tc.layers || len(c.MLALayers) != tc.mla || c.LatentWidth() != tc.latent {
			t.Errorf("%s: %d layers, %d MLA, latent %d; want %d, %d, %d", tc.name, c.NumLayers, len(c.MLALayers), c.LatentWidth(), tc.layers, tc.mla, tc.latent)
		}
	}
	if _, err := Config("huge"); err == nil {
		t.Error("unknown config accepted")
	}
}

func TestRandomSeqAndDiff(t *testing.T) {
	c, err := Config("tiny")
	if err != nil {
		t.Fatal(err)
	}
	all := AllLayers(c.NumLayers)
	a := RandomSeq(c, all, 7, model.BF16, 1)
	b := RandomSeq(c, all, 7, model.BF16, 1)
	if err := Diff(a, b, all); err != nil {
		t.Fatalf("same seed differs: %v", err)
	}
	// The MLA layer 3 holds [7, 40] bf16.
	if p := b.Layers[3].Part(model.PartLatent); len(p.Data) != 7*40*2 {
		t.Fatalf("latent part has %d bytes", len(p.Data))
	}
	b.Layers[3].Parts[0].Data[100] ^= 1
	if err := Diff(a, b, all); err == nil {
		t.Fatal("flipped bit not reported")
	}
	if err := Diff(a, RandomSeq(c, all, 7, model.BF16, 2), all); err == nil {
		t.Fatal("different seeds compare equal")
	}
}
