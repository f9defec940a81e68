package kvtransfer

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
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

// Shared is a transport whose listener takes TCP on its address and RDMA
// link bootstraps on the next port (the TCP port + 1), merging both into
// one stream of connections; it dials over RDMA, at the next port of the
// address it is given. A decode rank uses it so that the prefill worker
// reaches it over TCP while its neighbours use RDMA.
type Shared struct {
	TCP  *TCP
	RDMA *rdma.Transport
}

// RDMAAddr is where a Shared listener on addr takes RDMA bootstraps.
func RDMAAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p >= 65535 {
		return "", fmt.Errorf("kvtransfer: address %q: no port to put RDMA next to", addr)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}

// Dial opens a connection over the RDMA link to addr's listener.
func (s Shared) Dial(ctx context.Context, addr string) (Conn, error) {
	ra, err := RDMAAddr(addr)
	if err != nil {
		return nil, err
	}
	return RDMA{T: s.RDMA}.Dial(ctx, ra)
}

// Listen accepts TCP on addr and RDMA on the next port. With port 0 it
// picks a TCP port whose next one is free.
func (s Shared) Listen(addr string) (Listener, error) {
	tcp := s.TCP
	if tcp == nil {
		tcp = &TCP{}
	}
	var lastErr error
	for try := 0; try < 20; try++ {
		tl, err := tcp.Listen(addr)
		if err != nil {
			return nil, err
		}
		ra, err := RDMAAddr(tl.Addr())
		if err != nil {
			tl.Close()
			return nil, err
		}
		rl, err := s.RDMA.Listen(ra)
		if err != nil {
			tl.Close()
			lastErr = err
			if _, port, _ := net.SplitHostPort(addr); port == "0" {
				continue // another free port may have a free neighbour
			}
			return nil, err
		}
		l := &sharedListener{tcp: tl, rl: rl, out: make(chan Conn), done: make(chan struct{})}
		l.wg.Add(2)
		go l.pump(func() (Conn, error) { return tl.Accept() })
		go l.pump(func() (Conn, error) {
			c, err := rl.Accept()
			if err != nil {
				return nil, err
			}
			return rdmaConn{c}, nil
		})
		return l, nil
	}
	return nil, lastErr
}

type sharedListener struct {
	tcp  Listener
	rl   *rdma.Listener
	out  chan Conn
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (l *sharedListener) pump(accept func() (Conn, error)) {
	defer l.wg.Done()
	for {
		c, err := accept()
		if err != nil {
			return
		}
		select {
		case l.out <- c:
		case <-l.done:
			c.Close()
			return
		}
	}
}

func (l *sharedListener) Accept() (Conn, error) {
	select {
	case c := <-l.out:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("kvtransfer: accept on %s: %w", l.Addr(), ErrClosed)
	}
}

func (l *sharedListener) Addr() string { return l.tcp.Addr() }

func (l *sharedListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.tcp.Close()
		l.rl.Close()
		l.wg.Wait()
	})
	return nil
}

// ChooseTransport returns the transport mode names: "tcp", "rdma" (fail
// when RDMA cannot run) or "auto" (RDMA when a device with an ACTIVE port
// has a GID for localIP, else TCP, saying why in the log). Over RDMA it is
// a Shared transport, so that TCP peers still reach the listener. rc's
// Provider is the verbs library: kvtransfer never loads the system's
// itself (package sysverbs does), so that only binaries that may choose
// RDMA link it.
func ChooseTransport(mode string, rc rdma.Config, localIP net.IP, log *zap.Logger) (Transport, error) {
	if log == nil {
		log = zap.NewNop()
	}
	switch mode {
	case "", "tcp":
		return &TCP{}, nil
	case "rdma", "auto":
	default:
		return nil, fmt.Errorf("kvtransfer: transport %q: want tcp, rdma or auto", mode)
	}
	t, err := func() (*rdma.Transport, error) {
		if rc.Provider == nil {
			return nil, fmt.Errorf("%w: none given", verbs.ErrNoLibrary)
		}
		if rc.Logger == nil {
			rc.Logger = log
		}
		t, err := rdma.New(rc)
		if err != nil {
			return nil, err
		}
		if err := t.Probe(localIP); err != nil {
			t.Close()
			return nil, err
		}
		return t, nil
	}()
	if err != nil {
		if mode == "rdma" {
			return nil, fmt.Errorf("kvtransfer: transport rdma: %w", err)
		}
		log.Warn("transport auto: RDMA unavailable, falling back to TCP", zap.String("local_ip", localIP.String()), zap.Error(err))
		return &TCP{}, nil
	}
	log.Info("transport: RDMA", zap.String("local_ip", localIP.String()), zap.String("device", rc.Device))
	return Shared{RDMA: t}, nil
}
