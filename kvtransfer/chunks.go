package kvtransfer

// The chunk grid: a part of size n is cut into chunks of the receiver's
// chunk size c; chunk i covers bytes [i*c, min((i+1)*c, n)). The receiver
// accepts only whole grid chunks, so its bookkeeping is one state per chunk
// and a resent chunk always covers exactly the bytes of the original.

func chunkCount(n, c int) int { return (n + c - 1) / c }

func chunkSpan(n, c, i int) (off, length int) {
	off = i * c
	return off, min(c, n-off)
}

// bitmap is a set of chunk indices, as sent in a WELCOME.
type bitmap []byte

func newBitmap(n int) bitmap    { return make(bitmap, (n+7)/8) }
func (b bitmap) set(i int)      { b[i/8] |= 1 << (i % 8) }
func (b bitmap) has(i int) bool { return i >= 0 && i/8 < len(b) && b[i/8]&(1<<(i%8)) != 0 }

// shapeBytes is the byte size of a dense array of the given shape and
// element size, or -1 when a dimension is negative or the size overflows.
func shapeBytes(shape []int, elem int) int {
	n := elem
	for _, d := range shape {
		if d < 0 || (d > 0 && n > (1<<62)/d) {
			return -1
		}
		n *= d
	}
	return n
}
