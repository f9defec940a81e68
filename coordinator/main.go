// Command coordinator is tandem's coordinator: it accepts jobs over NATS,
// routes each between a GPU prefill worker and the decode group's own
// prefill by predicted time to first token, drives it through prefill,
// state transfer and decode, and streams its tokens and events back.
//
//	coordinator demo                    everything on this machine
//	coordinator serve --model DIR       a coordinator (embedded NATS unless --nats-url)
//	coordinator submit "prompt"         run a job, stream its tokens
//	coordinator jobs | workers | cancel JOB
//
// Run `coordinator --help` and `coordinator CMD --help` for every option.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tandem-inference/tandem/coordinator/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
