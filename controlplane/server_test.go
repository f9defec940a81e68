package controlplane

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// pingPong proves a connection works end to end: a request answered by a
// subscriber on the same server.
func pingPong(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.Subscribe("tandem.v1.test.ping", func(m *nats.Msg) { _ = m.Respond(append([]byte("pong:"), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	r, err := nc.Request("tandem.v1.test.ping", []byte("x"), 5*time.Second)
	if err != nil {
		t.Fatalf("request over the connection: %v", err)
	}
	if string(r.Data) != "pong:x" {
		t.Fatalf("reply %q, want pong:x", r.Data)
	}
}

// refused asserts that connecting with o fails promptly for the reason
// given: reason must accept the error. A timeout or a cancelled context is
// never a refusal, whatever its text.
func refused(t *testing.T, o Options, why string, reason func(error) bool) {
	t.Helper()
	o.MaxReconnects = -1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := Connect(ctx, o)
	if err == nil {
		nc.Close()
		t.Fatalf("connected with %s; want a refusal", why)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, nats.ErrTimeout) || ctx.Err() != nil {
		t.Fatalf("%s: %v; want a refusal, not a timeout", why, err)
	}
	if !reason(err) {
		t.Fatalf("%s refused for another reason: %v", why, err)
	}
	t.Logf("%s refused: %v", why, err)
}

// notAuthorized: the server refused the credentials.
func notAuthorized(err error) bool { return errors.Is(err, nats.ErrAuthorization) }

// tlsRefused: the TLS handshake failed for one of the reasons named (the
// wording of the side that noticed first: the client's verification, or
// the server closing on a missing client certificate).
func tlsRefused(reasons ...string) func(error) bool {
	return func(err error) bool {
		for _, r := range reasons {
			if strings.Contains(err.Error(), r) {
				return true
			}
		}
		return false
	}
}

func TestAuthUserPassword(t *testing.T) {
	sec := security{User: "alice", Password: "s3cret-pw"}
	serverKinds(t, sec, func(t *testing.T, srv testServer) {
		pingPong(t, connect(t, clientOptions(srv.url, sec)))
		refused(t, Options{URL: srv.url, User: "alice", Password: "wrong"}, "wrong password", notAuthorized)
		refused(t, Options{URL: srv.url}, "no credentials", notAuthorized)
		refused(t, Options{URL: srv.url, Token: "s3cret-pw"}, "a token instead of a user", notAuthorized)
	})
}

func TestAuthToken(t *testing.T) {
	sec := security{Token: "tok-0123456789"}
	serverKinds(t, sec, func(t *testing.T, srv testServer) {
		pingPong(t, connect(t, clientOptions(srv.url, sec)))
		refused(t, Options{URL: srv.url, Token: "tok-wrong"}, "wrong token", notAuthorized)
		refused(t, Options{URL: srv.url}, "no token", notAuthorized)
	})
}

func TestAuthNKey(t *testing.T) {
	dir := t.TempDir()
	seedFile := func(name string) (string, string) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		p := filepath.Join(dir, name+".nk")
		if err := os.WriteFile(p, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		return p, pub
	}
	goodSeed, goodPub := seedFile("good")
	otherSeed, _ := seedFile("other")
	sec := security{NKeys: []string{goodPub}, ClientSeed: goodSeed}
	serverKinds(t, sec, func(t *testing.T, srv testServer) {
		pingPong(t, connect(t, clientOptions(srv.url, sec)))
		refused(t, Options{URL: srv.url, NKeySeedFile: otherSeed}, "an unknown nkey", notAuthorized)
		refused(t, Options{URL: srv.url}, "no nkey", notAuthorized)
	})
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	sec := security{
		TLS:       &TLSFiles{Cert: pki.ServerCert, Key: pki.ServerKey, CA: pki.CA},
		ClientTLS: &TLSFiles{CA: pki.CA, Cert: pki.ClientCert, Key: pki.ClientKey},
	}
	serverKinds(t, sec, func(t *testing.T, srv testServer) {
		if !strings.HasPrefix(srv.url, "tls://") {
			t.Errorf("client URL %s, want tls://", srv.url)
		}
		pingPong(t, connect(t, clientOptions(srv.url, sec)))
		refused(t, Options{URL: srv.url, TLS: &TLSFiles{CA: pki.OtherCA, Cert: pki.ClientCert, Key: pki.ClientKey}}, "a client trusting another CA",
			tlsRefused("certificate signed by unknown authority"))
		// TLS 1.3: the server's refusal of the missing certificate reaches
		// the client as an alert or as the connection closed after the
		// handshake, depending on which read comes first.
		refused(t, Options{URL: srv.url, TLS: &TLSFiles{CA: pki.CA}}, "a client without a certificate",
			tlsRefused("certificate required", "closed by remote after TLS handshake"))
		// The server demands TLS before anything else: the client must
		// upgrade, and without the test CA it cannot trust the server.
		refused(t, Options{URL: "nats://" + strings.TrimPrefix(srv.url, "tls://")}, "a plain-text client",
			func(err error) bool {
				return errors.Is(err, nats.ErrSecureConnRequired) || tlsRefused("certificate signed by unknown authority")(err)
			})
	})
}

func TestConnectRejectsBadOptions(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.nk")
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"two credentials", Options{User: "a", Password: "b", Token: "c"}, "only one of"},
		{"user without password", Options{User: "a"}, "together"},
		{"missing seed file", Options{NKeySeedFile: missing}, "nkey seed file"},
		{"missing creds file", Options{CredsFile: missing}, "creds file"},
		{"missing CA", Options{TLS: &TLSFiles{CA: missing}}, "CA file"},
		{"cert without key", Options{TLS: &TLSFiles{Cert: missing}}, "together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Connect(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// A server that accepts TCP but never speaks NATS must not hold Connect
// past its context.
func TestConnectHonoursContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Connect(ctx, Options{URL: "nats://" + ln.Addr().String(), ConnectTimeout: 30 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Connect returned after %v, want about 200ms", d)
	}
}

func TestServerConfigErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  ServerConfig
		want string
	}{
		{"token with user", ServerConfig{Token: "t", User: "u", Password: "p"}, "cannot be combined"},
		{"user without password", ServerConfig{User: "u"}, "together"},
		{"bad nkey", ServerConfig{NKeys: []string{"SUAseed"}}, "not a public user nkey"},
		{"TLS without key", ServerConfig{TLS: &TLSFiles{Cert: "c.pem"}}, "cert and key"},
		{"TLS files missing", ServerConfig{TLS: &TLSFiles{Cert: "/nonexistent/c.pem", Key: "/nonexistent/k.pem"}}, "TLS"},
		{"port out of range", ServerConfig{Port: 70000}, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := StartServer(ctx, tc.cfg)
			if err == nil {
				_ = s.Shutdown(ctx)
				t.Fatal("server started; want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestServerPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	s, err := StartServer(context.Background(), ServerConfig{Port: port, ReadyTimeout: time.Second})
	if err == nil {
		_ = s.Shutdown(context.Background())
		t.Fatal("started on a port in use")
	}
	if !strings.Contains(err.Error(), "not accepting connections") {
		t.Fatalf("error %q, want it to say the server is not accepting connections", err)
	}
}

// Jobs stored by an embedded server survive its restart on the same data
// directory: a coordinator restart loses nothing.
func TestEmbeddedServerKeepsJobsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func() (*Server, *nats.Conn, *JobQueue) {
		s, err := StartServer(ctx, ServerConfig{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := Connect(ctx, Options{URL: s.ClientURL()})
		if err != nil {
			t.Fatal(err)
		}
		q, err := OpenJobQueue(ctx, nc, QueueConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return s, nc, q
	}
	s, nc, q := start()
	if s.StoreDir() != dir {
		t.Errorf("StoreDir %s, want %s", s.StoreDir(), dir)
	}
	job := testJob(t, "")
	if _, err := q.Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	s, nc, q = start()
	defer func() { nc.Close(); _ = s.Shutdown(ctx) }()
	d, err := q.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Job.JobID != job.JobID {
		t.Fatalf("got job %s after restart, want %s", d.Job.JobID, job.JobID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestEmbeddedServerTempDirRemoved(t *testing.T) {
	ctx := context.Background()
	s, err := StartServer(ctx, ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.StoreDir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("temporary store %s: %v", dir, err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temporary store %s still there after Shutdown (%v)", dir, err)
	}
}
