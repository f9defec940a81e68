// Package costmodel prices prefill: the work of a prompt per term (the KDA
// and MLA projections, the MoE, the MLA attention) in FLOPs, rates fitted
// to a worker's measured prefills (Fit), and the predicted time to first
// token of a job each way, prefilled by the decode group itself or by the
// prefill worker with its state transferred (PredictLocal, PredictRemote). The router decides
// by it and the simulator times by it, so the two cannot disagree.
package costmodel
