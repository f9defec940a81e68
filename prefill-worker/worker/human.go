package worker

import "github.com/tandem-inference/tandem/internal/progress"

func humanBytes(n int64) string { return progress.HumanBytes(n) }
