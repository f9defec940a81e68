package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Options says how to reach a NATS deployment. Every field is optional: the
// zero value connects to nats://127.0.0.1:4222 without authentication.
type Options struct {
	// URL is one server URL or a comma-separated list of nats:// or tls://
	// URLs.
	URL  string
	Name string // connection name shown by the server's monitoring

	// Identity logs in with a tandem identity's user and password and sets
	// InboxPrefix to its own when that is empty. IdentityFile instead names
	// a file to read it from with LoadIdentity.
	Identity     *Identity
	IdentityFile string
	// InboxPrefix is the prefix of the connection's reply inboxes, by
	// default NATS's "_INBOX". A client's or a worker's identity may only
	// read its own, InboxPrefix of the identity.
	InboxPrefix string

	// Options authenticate with at most one of Identity, User and Password,
	// Token, NKeySeedFile and CredsFile, a JWT and nkey seed file for
	// operator-mode deployments.
	User         string
	Password     string
	Token        string
	NKeySeedFile string
	CredsFile    string

	// TLS, when set, turns TLS on. CA verifies the server, with the
	// system's roots when empty; Cert and Key are a client certificate.
	TLS *TLSFiles

	// ConnectTimeout bounds each dial and handshake; default 5 s.
	ConnectTimeout time.Duration
	// ReconnectWait is the pause between reconnect attempts; default 1 s.
	ReconnectWait time.Duration
	// MaxReconnects bounds reconnect attempts: 0 means the default of 60,
	// and a negative value means forever.
	MaxReconnects int
	// RetryConnect retries the first connection too, every ReconnectWait,
	// until Connect's context ends, so that a client started while the
	// server is down waits for it.
	RetryConnect bool

	// Logger gets disconnects, reconnects and asynchronous errors; nil
	// discards them.
	Logger *zap.Logger
}

func (o *Options) natsOptions() ([]nats.Option, error) {
	auths := 0
	for _, set := range []bool{o.Identity != nil || o.IdentityFile != "", o.User != "" || o.Password != "", o.Token != "", o.NKeySeedFile != "", o.CredsFile != ""} {
		if set {
			auths++
		}
	}
	if auths > 1 {
		return nil, errors.New("nats connect: give only one of an identity file, user/password, token, nkey seed file and creds file")
	}
	user, password, inbox := o.User, o.Password, o.InboxPrefix
	id := o.Identity
	if o.IdentityFile != "" {
		var err error
		if id, err = LoadIdentity(o.IdentityFile); err != nil {
			return nil, fmt.Errorf("nats connect: %w", err)
		}
	}
	if id != nil {
		if err := id.Validate(); err != nil {
			return nil, fmt.Errorf("nats connect: %w", err)
		}
		user, password = id.User, id.Password
		if inbox == "" {
			inbox = InboxPrefix(id.Principal, id.Name)
		}
	}
	if (o.User == "") != (o.Password == "") {
		return nil, errors.New("nats connect: user and password must be set together")
	}
	connectTimeout := o.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = 5 * time.Second
	}
	reconnectWait := o.ReconnectWait
	if reconnectWait <= 0 {
		reconnectWait = time.Second
	}
	maxReconnects := o.MaxReconnects
	if maxReconnects == 0 {
		maxReconnects = nats.DefaultMaxReconnect
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	var failing atomic.Bool
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.Timeout(connectTimeout),
		nats.ReconnectWait(reconnectWait),
		nats.MaxReconnects(maxReconnects),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", zap.String("server", redactURL(nc.ConnectedUrl())), zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			failing.Store(false)
			log.Info("nats reconnected", zap.String("server", redactURL(nc.ConnectedUrl())))
		}),
		// Only the first failed attempt after a loss is logged, not one
		// every reconnectWait: it says the server is gone, not merely
		// restarting under the process.
		nats.ReconnectErrHandler(func(nc *nats.Conn, err error) {
			if !failing.Swap(true) {
				log.Warn("nats reconnect failed; retrying", zap.Error(err), zap.Duration("every", reconnectWait))
			}
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			fields := []zap.Field{zap.Error(err)}
			if sub != nil {
				fields = append(fields, zap.String("subject", sub.Subject))
			}
			log.Error("nats asynchronous error", fields...)
		}),
	}
	switch {
	case user != "":
		opts = append(opts, nats.UserInfo(user, password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	case o.NKeySeedFile != "":
		if err := readable(o.NKeySeedFile, "nkey seed file"); err != nil {
			return nil, err
		}
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats connect: nkey seed file %s: %w", o.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	case o.CredsFile != "":
		if err := readable(o.CredsFile, "creds file"); err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if inbox != "" && inbox != "_INBOX" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	if o.TLS != nil {
		tc, err := clientTLS(o.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

func clientTLS(f *TLSFiles) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("nats connect: TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("nats connect: TLS CA file %s holds no PEM certificate", f.CA)
		}
		tc.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("nats connect: TLS client cert and key must be given together")
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("nats connect: TLS client certificate (cert %s, key %s): %w", f.Cert, f.Key, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func readable(path, what string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("nats connect: %s: %w", what, err)
	}
	return f.Close()
}

// handshakeTries bounds the tries of a connection without RetryConnect
// whose handshake was garbled: a server answered, so this is a race on a
// loaded machine (its first PING beat its PONG), not a missing server, and
// a worker or coordinator should not fail to start on it.
const handshakeTries = 3

// Connect connects to NATS. It fails fast on bad options, such as
// unreadable key files or conflicting credentials. Otherwise it returns
// when connected, when the server refuses, when ctx ends, and, without
// RetryConnect, when no server answers or after handshakeTries garbled
// handshakes; with RetryConnect it keeps trying those until ctx ends.
func Connect(ctx context.Context, o Options) (*nats.Conn, error) {
	opts, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	servers := o.URL
	if servers == "" {
		servers = nats.DefaultURL
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	wait := o.ReconnectWait
	if wait <= 0 {
		wait = time.Second
	}
	garbled := 0
	for {
		ch := make(chan result, 1)
		go func() {
			nc, err := nats.Connect(servers, opts...)
			ch <- result{nc, err}
		}()
		select {
		case r := <-ch:
			if r.err == nil {
				return r.nc, nil
			}
			retry := o.RetryConnect && transient(r.err)
			if !retry && garbledHandshake(r.err) && garbled+1 < handshakeTries {
				garbled++
				retry = true
			}
			if !retry {
				return nil, fmt.Errorf("nats connect to %s: %w", redactURL(servers), r.err)
			}
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("nats connect to %s: %w (last: %v)", redactURL(servers), ctx.Err(), r.err)
			}
		case <-ctx.Done():
			// The dial is bounded by ConnectTimeout; close whatever it yields.
			go func() {
				if r := <-ch; r.nc != nil {
					r.nc.Close()
				}
			}()
			return nil, fmt.Errorf("nats connect to %s: %w", redactURL(servers), ctx.Err())
		}
	}
}

// transient reports whether a failed first connection is worth another
// try under RetryConnect: no server answered, or the handshake with one was
// cut short or garbled (a server dying, or one too loaded to answer its
// PING before sending its own), as opposed to a refusal (credentials,
// TLS), which another try would only repeat.
func transient(err error) bool {
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || garbledHandshake(err)
}

// garbledHandshake: the server's first line after our PING was not PONG.
// nats.go reports it only as text.
func garbledHandshake(err error) bool {
	return strings.HasPrefix(err.Error(), "nats: expected '")
}

// redactURL hides passwords and tokens in server URLs before they are logged.
func redactURL(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		u.User = url.User("redacted")
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// HasAuth reports whether o says how to log in.
func (o *Options) HasAuth() bool {
	return o.Identity != nil || o.IdentityFile != "" || o.User != "" || o.Token != "" || o.NKeySeedFile != "" || o.CredsFile != ""
}

// UseLocalIdentity makes o log in as this machine's identity of principal
// p when o has no credentials of its own and that file exists; it returns
// the file used, or "". The file is in DefaultCredentialsDir, written by
// the first embedded server.
func (o *Options) UseLocalIdentity(p Principal) string {
	if o.HasAuth() {
		return ""
	}
	dir, err := DefaultCredentialsDir()
	if err != nil {
		return ""
	}
	path := IdentityFile(dir, p)
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	o.IdentityFile = path
	return path
}

// ClientName is the client namespace a connection speaks for: the name in
// its client inbox prefix, InboxPrefix(PrincipalClient, name), or
// DefaultClient for a connection without one, as on an open server.
func ClientName(nc *nats.Conn) string {
	if name, ok := strings.CutPrefix(nc.Opts.InboxPrefix, InboxPrefix(PrincipalClient, "")); ok && CheckID(name) == nil {
		return name
	}
	return DefaultClient
}
