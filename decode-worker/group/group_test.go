package group

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func reference(t *testing.T, dir string, prompt []int32, n int) []int32 {
	t.Helper()
	m, err := model.Load(dir, cpu.New(0), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want, err := m.Generate(context.Background(), prompt, n)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

func TestGenerateMatchesMonolithic(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	prompt := []int32{5, 17, 200, 33, 4, 250}
	want := reference(t, dir, prompt, 32)
	for ranks := 1; ranks <= 3; ranks++ {
		t.Run(fmt.Sprintf("ranks%d", ranks), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			g, err := Start(ctx, Options{ModelDir: dir, Ranks: ranks, Idle: 2 * time.Second, Heartbeat: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			got, err := g.Generate(ctx, "s1", prompt, 32)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("group of %d: %v\nmonolithic:  %v", ranks, got, want)
			}
		})
	}
}
