package main

import (
	"context"
	"os"
	"runtime/pprof"
	"testing"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

func TestZZProf(t *testing.T) {
	cfg, _ := transferConfig(os.Getenv("M"))
	src := kvtest.RandomSeq(cfg, kvtest.AllLayers(cfg.NumLayers), 2048, model.BF16, 1)
	f, _ := os.Create("/tmp/rdma-cpu.prof")
	pprof.StartCPUProfile(f)
	defer pprof.StopCPUProfile()
	err := transferRDMAFake(context.Background(), transferFlags{model: "x", tokens: 2048, ranks: 2, conns: 2, chunk: 1 << 20, window: 32, reps: 3, seed: 1}, cfg, src)
	if err != nil {
		t.Fatal(err)
	}
}
