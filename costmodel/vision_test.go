package costmodel

import (
	"encoding/json"
	"testing"
	"time"
)

// TestVisionWork: K3's tower over one 1024x768 image (a 74x56 patch grid
// once padded, 4,144 patches) is the closed form of its sizes: per patch
// the patch embedding and 27 blocks' projections, per pair of patches the
// attention, per merged row the projector. Attention stays inside an
// image: two images cost twice one, one image of twice the patches more.
func TestVisionWork(t *testing.T) {
	m := New(config(t, "k3"), 2)
	if m.Vision == nil {
		t.Fatal("k3 has no vision tower")
	}
	v := *m.Vision
	if v != (Vision{Layers: 27, Hidden: 1024, QKV: 1536, MLP: 4096, PatchValues: 588, Merge: 4, TextHidden: 7168}) {
		t.Fatalf("k3 vision sizes %+v", v)
	}
	const n = 4144
	perPatch := 2.0*588*1024 + 27*2*(1024*3*1536+1536*1024+2*1024*4096.0)
	perPair := 27 * 4 * 1536.0
	perRow := 2 * (4096*4096 + 4096*7168.0)
	want := perPatch*n + perPair*n*n + perRow*n/4
	if got := v.Work([]int{n}); got != want {
		t.Fatalf("one 1024x768 image: %v FLOPs, want %v", got, want)
	}
	t.Logf("k3 tower over a 1024x768 image: %.2f TFLOP (a 1k-token prompt's prefill: %.1f TFLOP)", want/1e12, m.Work(0, 1000).Total()/1e12)
	if two, one := v.Work([]int{n, n}), v.Work([]int{n}); two != 2*one || v.Work([]int{2 * n}) <= two {
		t.Fatal("attention is not per image")
	}
	c := config(t, "tiny")
	if tv, ok := VisionOf(c); !ok || tv.Layers <= 0 || tv.TextHidden != c.HiddenSize {
		t.Fatalf("tiny vision %+v %v", tv, ok)
	}
	c.Vision = json.RawMessage("null")
	if New(c, 2).Vision != nil {
		t.Fatal("a config without vision_config has a tower")
	}
}

// TestPredictionsPriceTheTower: a prompt with an image pays the tower's
// time at the path's vision rate before its prefill; a queue in front of
// it moves meanwhile (a pass longer than the tower hides it), unless the
// path runs the tower in its own loop (a device backend); a cached
// prefix that covers the image runs no tower; an unmeasured vision rate
// takes the path's dense rate. The router's choice follows: a slow tower
// on the prefill worker sends the prompt local.
func TestPredictionsPriceTheTower(t *testing.T) {
	m := New(config(t, "k3"), 2)
	work := m.Vision.Work([]int{4144})
	r := Rates{PassFloor: 2 * time.Second, Prefill: Uniform(2000, 0), Local: Uniform(200, 0), LinkBytesPerS: 10e9,
		DecodeStep: 50 * time.Millisecond, PrefillVision: 1000, LocalVision: 100}
	text := Load{PrefillUp: true}
	img := Load{PrefillUp: true, Images: []Image{{End: 600, Patches: 4144}}}
	const prompt = 1000

	lt, li := PredictLocal(m, r, text, prompt), PredictLocal(m, r, img, prompt)
	if want := seconds(work / 100e9); li.Vision != want || li.Total != lt.Total+want {
		t.Fatalf("local: tower %v, total %v; want %v and %v", li.Vision, li.Total, want, lt.Total+want)
	}
	rt, ri := PredictRemote(m, r, text, prompt), PredictRemote(m, r, img, prompt)
	if want := seconds(work / 1000e9); ri.Vision != want || ri.Total != rt.Total+want {
		t.Fatalf("remote: tower %v, total %v; want %v and %v", ri.Vision, ri.Total, want, rt.Total+want)
	}

	busy := func(l Load) Load { l.PassRunning, l.PassRemaining = true, 100*time.Second; return l }
	if a, b := PredictRemote(m, r, busy(text), prompt), PredictRemote(m, r, busy(img), prompt); a.Total != b.Total || b.QueueWait != a.QueueWait-b.Vision {
		t.Fatalf("a pass of 100 s in front: %v with the image, %v without", b.Total, a.Total)
	}
	serial := r
	serial.PrefillVisionSerial = true
	if a, b := PredictRemote(m, serial, busy(text), prompt), PredictRemote(m, serial, busy(img), prompt); b.Total != a.Total+b.Vision || b.QueueWait != a.QueueWait {
		t.Fatalf("a tower run in the pass loop: %v with the image, %v without", b.Total, a.Total)
	}
	cached := img
	cached.LocalCached, cached.RemoteCached = 640, 640
	if PredictLocal(m, r, cached, prompt).Vision != 0 || PredictRemote(m, r, cached, prompt).Vision != 0 {
		t.Fatal("a cached prefix that covers the image still runs the tower")
	}
	stand := r
	stand.LocalVision = 0
	if got, want := PredictLocal(m, stand, img, prompt).Vision, seconds(work/r.Local.Dense/1e9); got != want {
		t.Fatalf("unmeasured vision rate: %v, want the dense rate's %v", got, want)
	}
	stand.Local = Compute{}
	if PredictLocal(m, stand, img, prompt).Total != Unknown {
		t.Fatal("an unknown rate priced the tower")
	}

	// The router's comparison: remote wins for the text prompt; with a
	// tower 50x slower on the prefill worker than on the group, local.
	slow := r
	slow.PrefillVision, slow.LocalVision = 2, 100
	if PredictRemote(m, slow, text, prompt).Total >= PredictLocal(m, slow, text, prompt).Total {
		t.Fatal("the text prompt does not go remote: the test proves nothing")
	}
	if PredictRemote(m, slow, img, prompt).Total <= PredictLocal(m, slow, img, prompt).Total {
		t.Fatal("the image prompt still goes remote despite the prefill worker's slow tower")
	}
}

// TestImagesOf: images sit on the prompt's pad runs in order.
func TestImagesOf(t *testing.T) {
	p := []int32{1, 9, 9, 2, 9, 3, 9, 9, 9}
	got := ImagesOf(p, 9, []int{16, 4})
	if len(got) != 2 || got[0] != (Image{End: 3, Patches: 16}) || got[1] != (Image{End: 5, Patches: 4}) {
		t.Fatalf("%+v", got)
	}
}
