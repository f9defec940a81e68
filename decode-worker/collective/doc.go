// Package collective is an all-reduce for the small messages of
// tensor- and expert-parallel decode: a few tens of KB of float32 per layer
// and step, summed over the ranks of a stage.
//
// # Contract
//
// A Group is rank Rank of Ranks, with a Link to each peer it exchanges with.
// Every rank calls AllReduce with a buffer of the same length, the same
// number of times, in the same order; AllReduce replaces each rank's buffer
// with the element-wise sum of all ranks' buffers.
//
// The sum of element i is always
//
//	s := float64(x_0[i])
//	s += float64(x_1[i])
//	...
//	s += float64(x_{n-1}[i])
//	result[i] = float32(s)
//
// where x_r is rank r's buffer: accumulated in float64, in rank order, and
// rounded to float32 once. The order does not depend on the number of
// ranks, the algorithm, the chunking or the order in which frames arrive, so
// every rank ends a call with bit-identical results, the results equal a
// sequential rank-order sum computed anywhere else, and a run is
// reproducible.
//
// # Algorithms
//
// Up to four ranks (DirectMax) use direct exchange: each rank sends its whole
// buffer to every other rank, receives every other rank's, and sums the n
// buffers in rank order. Its latency is one message time.
//
// Above four ranks, the ranks use only their ring links (rank r sends to rank
// r+1 and rank n-1 to rank 0), in two pipelined passes over chunks of the
// buffer (Config.ChunkElems elements each): a reduce pass in which rank 0
// sends its chunk, widened to float64, to rank 1, each rank r adds its own
// values to the float64 partial sum it receives from rank r-1 and passes it
// on, and rank n-1 adds its own and rounds the final sums to float32; then a
// broadcast pass in which rank n-1 sends the final chunks to rank 0 and they
// are passed along to rank n-2, each rank copying them. The partial sums
// travel in float64 and every chunk's sum starts at rank 0, so the order is
// the rank order above; the broadcast copies the bits that rank n-1 rounded,
// so all ranks hold the same bits.
//
// This is not the bandwidth-optimal reduce-scatter ring, in which each
// chunk's sum starts at a different rank: that would fix the order per chunk
// but not make it rank order, and its results would differ from direct
// exchange and from a sequential sum. For the message sizes decode exchanges
// the ring is latency-bound, and the two passes cost 2(n-2+K) chunk hops
// against the reduce-scatter ring's 2(n-1), K being the number of chunks.
//
// # Framing and failures
//
// Each frame carries the call's sequence number (counted by each Group from
// 1), the sending rank, the pass, the chunk and its element count. A frame
// whose sequence number is not the current call's (a late or duplicated
// frame of an earlier call), that comes from the wrong rank or pass, or whose
// length is not the expected one is an error, never summed. Receive buffers
// are sized from the local buffer, never from what a peer announces.
//
// Any error (a peer's link closed or failing, a bad frame, ctx ending while
// a peer is awaited) ends the call with a *PeerError that names the peer it
// concerns, and breaks the
// Group: it closes its links, so that the peers' calls fail too instead of
// waiting, and every later call fails with ErrBroken and that error. A
// broken group is rebuilt from new links.
//
// Stats reports the calls' latencies (the last, the largest, the total), for
// a caller that reports them per step.
//
// # Links
//
// A Link is a reliable, ordered, authenticated frame link to one peer. The
// package adapts a kvtransfer.Channel (ChannelLink), which is authenticated
// and runs over TCP or the RDMA transport with the same code, and a plain
// byte stream already authenticated by other means (StreamLink). Connect
// dials and accepts the kvtransfer channels a group needs.
package collective
