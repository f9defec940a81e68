package testkit

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Child runs the test binary as a command when the environment variable
// env is "1" (a test re-executed the binary as a child process, instead of
// building the command) and exits with run's code; otherwise it returns at
// once. Call it first in TestMain. run's context ends on SIGINT or SIGTERM.
func Child(env string, run func(ctx context.Context, args []string) int) {
	if os.Getenv(env) != "1" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
