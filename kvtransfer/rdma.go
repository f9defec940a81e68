package kvtransfer

import (
	"context"

	"github.com/tandem-inference/tandem/kvtransfer/rdma"
)

// RDMA is the RDMA transport (package kvtransfer/rdma) as a Transport:
// frames go over a reliable link on UC queue pairs, one link per peer with
// the connections multiplexed over it.
type RDMA struct{ T *rdma.Transport }

// Dial opens a connection over the link to addr's listener.
func (r RDMA) Dial(ctx context.Context, addr string) (Conn, error) {
	c, err := r.T.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return rdmaConn{c}, nil
}

// Listen accepts link bootstraps on addr and connections over the links.
func (r RDMA) Listen(addr string) (Listener, error) {
	l, err := r.T.Listen(addr)
	if err != nil {
		return nil, err
	}
	return rdmaListener{l}, nil
}

type rdmaConn struct{ *rdma.Conn }

func (c rdmaConn) ReadFrame(place PlaceFunc) error { return c.Conn.ReadFrame(place) }

type rdmaListener struct{ *rdma.Listener }

func (l rdmaListener) Accept() (Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return rdmaConn{c}, nil
}
