package imagejob_test

import (
	"context"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testimage"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/media"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
)

// BenchmarkImageShare: one 1024x768 image through the small preset's
// tower and projector (decode and preprocessing included), against the
// time to first token of a 1k-token text prompt on the same model and
// backend, both measured in each iteration.
func BenchmarkImageShare(b *testing.B) {
	dir := testmodel.Dir(b, "small", 1, 0)
	be := cpu.New(0)
	m, err := model.Load(dir, be, model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	tw, err := vision.Load(context.Background(), be, dir)
	if err != nil {
		b.Fatal(err)
	}
	defer tw.Close()
	img := testimage.PNG(b, 1024, 768, 3)
	enc := imagejob.NewEncoder(m.Cfg, tw, "bench")
	_, _, gw, gh, err := media.Plan(1024, 768)
	if err != nil {
		b.Fatal(err)
	}
	rows := gw / 2 * (gh / 2)
	text := make([]int32, 1024)
	for i := range text {
		text[i] = int32((i*7919 + 11) % m.Cfg.VocabSize)
	}
	var tower, ttft time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		j, err := enc.Prepare(prompt(enc.Pad, rows), [][]byte{img})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := enc.Features(context.Background(), j); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, _, err := m.Start(context.Background(), text); err != nil {
			b.Fatal(err)
		}
		tower, ttft = tower+t1.Sub(t0), ttft+time.Since(t1)
	}
	b.ReportMetric(float64(rows), "rows")
	b.ReportMetric(tower.Seconds()*1e3/float64(b.N), "image-ms")
	b.ReportMetric(ttft.Seconds()*1e3/float64(b.N), "1k-prompt-ms")
	b.ReportMetric(tower.Seconds()/ttft.Seconds(), "image/1k-prompt")
}
