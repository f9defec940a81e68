//go:build race

package planner_test

// raceEnabled: the race detector changes what the allocator sees (sync.Pool
// drops items at random, instrumentation allocates), so allocation counts
// are not the CPU backend's.
const raceEnabled = true
