// Package sim is a discrete-event simulator of a tandem cluster: a prefill
// box that streams the weights layer by layer, a decode group that holds
// them resident, and the link between them. It drives the code the system
// runs: the coordinator's router (coordinator/router) routes every job with
// its estimator's rates, the pass planner (prefill-worker/planner) plans
// every weight pass under the box's memory budget, and passes batch jobs by
// the pass scheduler's rule (prefill-worker/scheduler).
//
// Hardware comes from profiles (configs/hardware/*.yaml, profile.go) and
// the model from its configuration alone (model.go): per-layer weight bytes
// and state bytes follow from the shapes and dtypes, per-layer work from
// flops.go. A pass is timed layer by layer (pass.go): each layer's read at
// the box's disk rate, its compute over the pass's tokens at the box's rate
// for that layer type, the planner's prefetch depth overlapping the two,
// and each layer's state put on the link as soon as the layer is done, so
// the transfer tail left after a pass is computed, not assumed. The decode
// group prefills local jobs in chunks and runs batched decode steps,
// alternating while it has both (group.go, cluster.go).
package sim
