// Package controlplane is tandem's NATS control plane: the subjects under
// tandem.v1, the messages sent on them (msgpack by default, JSON when a
// request says Content-Type: application/json), an embedded NATS server with
// JetStream, a client connection helper, and the durable building blocks the
// coordinator stands on: a JetStream work queue for submitted jobs (JobQueue)
// and a worker registry in a JetStream key-value bucket (Registry).
//
// Bulk bytes (KV cache, recurrent state, activations) never travel here; they
// go over the kvtransfer data plane, and NATS carries only the handshake.
// docs/PROTOCOL.md describes every subject and message for non-Go clients.
package controlplane
