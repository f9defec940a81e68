package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"
)

// DefaultMaxPayload is the embedded server's max_payload: room for a
// million-token prompt in one submission (NATS's own default is 1 MiB).
const DefaultMaxPayload = 8 << 20

// DefaultMaxPending is the embedded server's max_pending: what it buffers
// for one connection before it drops it as a slow consumer. NATS's own 64
// MiB is nine large prompts: a burst of them sent at once to a coordinator
// that reads as fast as it can (and answers those over its byte budget at
// once) must not take it off NATS. It bounds what a client that stops
// reading can make the server hold, too.
const DefaultMaxPending = 512 << 20

// TLSFiles names PEM files for TLS. For a server: Cert and Key are its
// certificate; CA, when set, verifies client certificates. For a client: CA
// verifies the server; Cert and Key, when set, are its client certificate.
type TLSFiles struct {
	CA   string `mapstructure:"ca" yaml:"ca" json:"ca,omitempty"`
	Cert string `mapstructure:"cert" yaml:"cert" json:"cert,omitempty"`
	Key  string `mapstructure:"key" yaml:"key" json:"key,omitempty"`
}

// ServerConfig configures an embedded NATS server. The zero value is a
// server on a random loopback port with JetStream in a temporary directory
// and no authentication (tests). Deployments give Identities; a listener
// beyond loopback without any authentication is refused unless Insecure.
type ServerConfig struct {
	Name string // server name; default "tandem"
	Host string // listen address; default 127.0.0.1
	Port int    // client port; 0 picks a free one
	// DataDir holds JetStream's store. Empty: a temporary directory,
	// removed at Shutdown (nothing survives a restart).
	DataDir    string
	MaxPayload int32 // default DefaultMaxPayload
	// JetStream resource limits in bytes; 0 lets the server choose.
	JetStreamMaxMemory int64
	JetStreamMaxStore  int64

	// Identities are tandem's users, each with the permissions of its
	// principal (Permissions): the way to run a deployment. They cannot be
	// combined with the single-user settings below.
	Identities []Identity

	// Single-user authentication, every user with every permission: User
	// and Password, and/or NKeys (public user keys, "U..."), or Token
	// alone. None set (and no Identities): no authentication.
	User     string
	Password string
	Token    string
	NKeys    []string

	// TLS, when set, makes the server require TLS. With TLS.CA set it also
	// requires client certificates signed by that CA.
	TLS *TLSFiles

	// Insecure allows a listener beyond loopback without authentication:
	// anyone who reaches the port can read and forge every job. The
	// caller warns.
	Insecure bool

	// Logger receives the server's log; nil discards it.
	Logger *zap.Logger
	// ReadyTimeout bounds the wait for the server to accept connections;
	// default 10 s.
	ReadyTimeout time.Duration
}

// Server is a running embedded NATS server.
type Server struct {
	ns       *server.Server
	storeDir string
	tmpDir   string // removed at Shutdown; empty when DataDir was given
}

func (c *ServerConfig) options() (*server.Options, error) {
	o := &server.Options{
		ServerName:             c.Name,
		Host:                   c.Host,
		Port:                   c.Port,
		MaxPayload:             c.MaxPayload,
		MaxPending:             DefaultMaxPending,
		JetStream:              true,
		StoreDir:               c.DataDir,
		JetStreamMaxMemory:     c.JetStreamMaxMemory,
		JetStreamMaxStore:      c.JetStreamMaxStore,
		DisableJetStreamBanner: true,
		NoSigs:                 true, // the embedding process owns signals
		NoLog:                  c.Logger == nil,
	}
	if o.ServerName == "" {
		o.ServerName = "tandem"
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	switch {
	case c.Port == 0:
		o.Port = server.RANDOM_PORT // nats-server's own 0 means 4222
	case c.Port < 0 || c.Port > 65535:
		return nil, fmt.Errorf("nats server: port %d out of range 0-65535", c.Port)
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if c.Token != "" && (c.User != "" || len(c.NKeys) > 0) {
		return nil, errors.New("nats server: token authentication cannot be combined with user/password or nkeys; choose one")
	}
	if (c.User == "") != (c.Password == "") {
		return nil, errors.New("nats server: user and password must be set together")
	}
	if len(c.Identities) > 0 && (c.Token != "" || c.User != "" || len(c.NKeys) > 0) {
		return nil, errors.New("nats server: identities cannot be combined with user/password, token or nkeys; choose one")
	}
	o.Authorization = c.Token
	if c.User != "" {
		o.Users = []*server.User{{Username: c.User, Password: c.Password}}
	}
	if len(c.Identities) > 0 {
		users, err := serverUsers(c.Identities)
		if err != nil {
			return nil, err
		}
		o.Users = users
	}
	authenticated := len(c.Identities) > 0 || c.Token != "" || c.User != "" || len(c.NKeys) > 0 || (c.TLS != nil && c.TLS.CA != "")
	if !authenticated && !IsLoopback(o.Host) && !c.Insecure {
		return nil, fmt.Errorf("nats server: listening on %s, beyond loopback, without credentials: anyone who reaches it could read and forge every job; configure credentials (identities), or listen on 127.0.0.1, or allow it explicitly (insecure)", o.Host)
	}
	for i, pub := range c.NKeys {
		if !nkeys.IsValidPublicUserKey(pub) {
			return nil, fmt.Errorf("nats server: nkeys[%d] %q is not a public user nkey (it starts with U)", i, pub)
		}
		o.Nkeys = append(o.Nkeys, &server.NkeyUser{Nkey: pub})
	}
	if c.TLS != nil {
		if c.TLS.Cert == "" || c.TLS.Key == "" {
			return nil, errors.New("nats server: TLS needs both cert and key files")
		}
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: c.TLS.Cert, KeyFile: c.TLS.Key, CaFile: c.TLS.CA, Verify: c.TLS.CA != "",
		})
		if err != nil {
			return nil, fmt.Errorf("nats server: TLS (cert %s, key %s, ca %q): %w", c.TLS.Cert, c.TLS.Key, c.TLS.CA, err)
		}
		o.TLSConfig, o.TLS, o.TLSVerify, o.TLSTimeout = tc, true, c.TLS.CA != "", 2
	}
	return o, nil
}

// StartServer starts an embedded NATS server with JetStream and waits until
// it accepts connections (or ctx ends, or ReadyTimeout passes).
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	o, err := cfg.options()
	if err != nil {
		return nil, err
	}
	s := &Server{}
	if o.StoreDir == "" {
		if s.tmpDir, err = os.MkdirTemp("", "tandem-nats-"); err != nil {
			return nil, fmt.Errorf("nats server: temporary JetStream directory: %w", err)
		}
		o.StoreDir = s.tmpDir
	} else if err := os.MkdirAll(o.StoreDir, 0o700); err != nil {
		return nil, fmt.Errorf("nats server: JetStream directory: %w", err)
	}
	s.storeDir = o.StoreDir
	ns, err := server.NewServer(o)
	if err != nil {
		s.removeTmp()
		return nil, fmt.Errorf("nats server: %w", err)
	}
	s.ns = ns
	if cfg.Logger != nil {
		ns.SetLoggerV2(zapServerLogger{cfg.Logger.Named("nats").Sugar()}, false, false, false)
	}
	ns.Start()

	timeout := cfg.ReadyTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			s.shutdown()
			return nil, fmt.Errorf("nats server: start cancelled: %w", err)
		}
		if time.Now().After(deadline) {
			s.shutdown()
			return nil, fmt.Errorf("nats server: not accepting connections on %s:%d after %v (port in use? see the server log)", o.Host, cfg.Port, timeout)
		}
	}
	if !ns.JetStreamEnabled() {
		s.shutdown()
		return nil, fmt.Errorf("nats server: JetStream did not start in %s", o.StoreDir)
	}
	return s, nil
}

// ClientURL is the URL clients connect to (tls:// when TLS is on).
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// StoreDir is the JetStream data directory.
func (s *Server) StoreDir() string { return s.storeDir }

// Shutdown stops the server: it closes client connections, flushes
// JetStream to disk and removes a temporary data directory. It waits until
// the server is down or ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.shutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("nats server: shutdown not finished: %w", ctx.Err())
	}
}

func (s *Server) shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.removeTmp()
}

func (s *Server) removeTmp() {
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
	}
}

// zapServerLogger adapts zap to nats-server's logger. Fatalf maps to Error:
// the server decides what a fatal condition means for itself, and must not
// end the embedding process through the logger.
type zapServerLogger struct{ l *zap.SugaredLogger }

func (z zapServerLogger) Noticef(format string, v ...any) { z.l.Infof(format, v...) }
func (z zapServerLogger) Warnf(format string, v ...any)   { z.l.Warnf(format, v...) }
func (z zapServerLogger) Fatalf(format string, v ...any)  { z.l.Errorf(format, v...) }
func (z zapServerLogger) Errorf(format string, v ...any)  { z.l.Errorf(format, v...) }
func (z zapServerLogger) Debugf(format string, v ...any)  { z.l.Debugf(format, v...) }
func (z zapServerLogger) Tracef(format string, v ...any)  { z.l.Debugf(format, v...) }
