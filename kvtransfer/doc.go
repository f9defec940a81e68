// Package kvtransfer is tandem's data plane: it streams a sequence's decode
// state, layer by layer, from the prefill worker to the decode ranks that own
// each layer, while prefill is still computing the next layers.
//
// The pieces, bottom up:
//
//   - A Transport moves whole frames (a msgpack header plus a raw payload)
//     over a Conn. Only TCP is built (TCP); the interface is shaped for RDMA
//     SEND/RECV, so sequence numbers, credits and acknowledgements live in the
//     session layer above it, never in the transport.
//   - A Server (one per decode rank) accepts connections, authenticates them
//     (HMAC-SHA256 over a fresh server nonce with the session secret) and
//     writes verified chunks into the preallocated buffers of an expected
//     session (Expect). Its Incoming handle yields the committed state only
//     when every expected byte has arrived and passed its CRC-32C.
//   - A Sender implements model.LayerSink for one sequence: it splits each
//     layer's parts into chunks, routes them by a Placement to the ranks'
//     servers over several connections each, resends what was not
//     acknowledged after a dropped connection, and returns from Close when
//     every rank has committed.
//   - A Channel is a small authenticated, framed, bidirectional message
//     pipe over the same transport and port, for the decode pipeline mesh.
//
// The wire format is documented in docs/PROTOCOL.md ("Data plane").
package kvtransfer
