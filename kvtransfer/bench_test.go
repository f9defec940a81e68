package kvtransfer

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// BenchmarkTransfer streams a full-size K3 state (T=1024: 24 MLA layers of
// 1.2 MB and 69 KDA layers of 6.7 MB) to 2 ranks on loopback. Compare its
// MB/s with BenchmarkRawTCP's, run in the same invocation (bench transfer
// reports the ratio).
func BenchmarkTransfer(b *testing.B) {
	for _, tc := range []struct{ conns, chunk int }{{1, 256 << 10}, {1, 1 << 20}, {1, 4 << 20}, {2, 1 << 20}} {
		conns := tc.conns
		b.Run(fmt.Sprintf("conns%d/chunk%dK", conns, tc.chunk>>10), func(b *testing.B) {
			cfg, err := kvtest.Config("k3")
			if err != nil {
				b.Fatal(err)
			}
			all := kvtest.AllLayers(cfg.NumLayers)
			src := kvtest.RandomSeq(cfg, all, 1024, model.BF16, 1)
			var eps []string
			var srvs []*Server
			for i := 0; i < 2; i++ {
				srv, err := Listen(ServerConfig{Addr: "127.0.0.1:0", ChunkSize: tc.chunk})
				if err != nil {
					b.Fatal(err)
				}
				defer srv.Close()
				srvs = append(srvs, srv)
				eps = append(eps, srv.Addr())
			}
			place, _ := Contiguous(cfg.NumLayers, eps)
			b.SetBytes(int64(src.Bytes()))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sid := fmt.Sprint("b", i)
				var ins []*Incoming
				for _, srv := range srvs {
					in, err := srv.Expect(ExpectSpec{Session: sid, Secret: testSecret, Model: cfg, Layers: place.Layers(srv.Addr()),
						Tokens: 1024, Deadline: time.Now().Add(time.Minute)})
					if err != nil {
						b.Fatal(err)
					}
					ins = append(ins, in)
				}
				s, err := NewSender(SenderConfig{Session: sid, Secret: testSecret, Placement: place, Conns: conns, Deadline: time.Now().Add(time.Minute)})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				for _, L := range all {
					if err := s.PutLayer(ctx, src.Layers[L]); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Close(ctx, 1024); err != nil {
					b.Fatal(err)
				}
				for _, in := range ins {
					if _, err := in.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkRawTCP moves the same bytes over one plain loopback connection
// into freshly allocated buffers, faulted in first and kept until the
// whole state arrived: the baseline for BenchmarkTransfer.
func BenchmarkRawTCP(b *testing.B) {
	cfg, err := kvtest.Config("k3")
	if err != nil {
		b.Fatal(err)
	}
	src := kvtest.RandomSeq(cfg, kvtest.AllLayers(cfg.NumLayers), 1024, model.BF16, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer s.Close()
		for {
			// Fresh buffers kept for the whole state and faulted in before
			// the bytes arrive, as a receiver does.
			var dsts [][]byte
			for _, ls := range src.Layers {
				for _, p := range ls.Parts {
					dst := make([]byte, len(p.Data))
					prefault(dst)
					dsts = append(dsts, dst)
				}
			}
			for _, dst := range dsts {
				if _, err := io.ReadFull(s, dst); err != nil {
					done <- nil
					return
				}
			}
			done <- nil
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(src.Bytes()))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, ls := range src.Layers {
			for _, p := range ls.Parts {
				c.Write(p.Data)
			}
		}
		<-done
	}
	b.StopTimer()
	c.Close()
	<-done
}
