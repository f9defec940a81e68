package main

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kernels/cuda"
)

// openBackend makes the compute backend --backend names: cpu, cuda (an
// error naming what is missing when the GPU is not usable), or auto (cuda
// when usable, else cpu, with the reason logged). It returns the resolved
// kind ("cpu" or "cuda") and a func that releases the backend.
func openBackend(kind string, threads, device int, log *zap.Logger) (kernels.Backend, string, func(), error) {
	if kind == "cpu" {
		return cpu.New(threads), "cpu", func() {}, nil
	}
	b, err := cuda.Open(cuda.Options{Device: device})
	if err != nil {
		if kind == "cuda" {
			return nil, "", nil, fmt.Errorf("--backend cuda: %w", err)
		}
		log.Info("backend auto: CUDA is not usable, computing on the CPU", zap.Error(err))
		return cpu.New(threads), "cpu", func() {}, nil
	}
	in := b.Info()
	log.Info("backend: CUDA", zap.String("requested", kind), zap.String("device", in.Name), zap.Int("ordinal", in.Ordinal),
		zap.String("compute_capability", fmt.Sprintf("%d.%d", in.CC[0], in.CC[1])), zap.Uint64("memory_bytes", in.TotalMem),
		zap.Int("driver", in.DriverVersion), zap.String("library", in.Library))
	return b, "cuda", b.Close, nil
}
