// Package health is the operations endpoint every tandem process serves:
// /metrics (Prometheus text format), /healthz (the process is alive and
// serving HTTP) and /readyz (the process can take work now: each readiness
// check passes). It is one small HTTP server shared by the coordinator and
// both workers, so that they listen, authenticate and answer the same way.
//
// Like every tandem listener it stays on loopback unless told otherwise:
// an address beyond loopback needs a bearer token (Options.Token, sent by
// the scraper as "Authorization: Bearer TOKEN"), or the explicit opt-in
// Options.Public for a network the operator trusts (metrics carry worker
// ids, job counts and timings, nothing of any prompt or output).
package health

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/config"
)

// Options configure where and how the endpoint listens.
type Options struct {
	// Addr is host:port to listen on ("" serves nothing).
	Addr string
	// Token, when set, is required on every request as a bearer token.
	Token string
	// Public allows an address beyond loopback without a token.
	Public bool
}

// Settings are the endpoint's settings (metrics.listen, metrics.token,
// metrics.public) for a process whose endpoint listens on listen by
// default.
func Settings(listen string) []config.Setting {
	return []config.Setting{
		{Key: "metrics.listen", Default: listen, Help: "address of /metrics (Prometheus), /healthz and /readyz (port 0: any free port, logged; empty: off); beyond loopback it requires metrics.token or metrics.public"},
		{Key: "metrics.token", Default: "", Help: "bearer token /metrics, /healthz and /readyz require (Authorization: Bearer TOKEN); empty: none, loopback only unless metrics.public"},
		{Key: "metrics.public", Default: false, Help: "serve metrics.listen beyond loopback without a token (a network you trust: metrics name workers and count jobs, never their text)"},
	}
}

// OptionsFrom reads Settings' values, checking the address as Serve would
// (so that a refused address stops a process before it starts anything).
func OptionsFrom(getString func(string) string, getBool func(string) bool) (Options, error) {
	o := Options{Addr: getString("metrics.listen"), Token: getString("metrics.token"), Public: getBool("metrics.public")}
	if o.Addr == "" {
		return o, nil
	}
	return o, CheckListen("metrics", o.Addr, o.Token, o.Public)
}

// CheckListen refuses an address beyond loopback without a token unless
// public is set: a listener open to the network must ask for credentials,
// or the operator must say in so many words that it need not. prefix is
// the settings' prefix the errors name (prefix.listen, prefix.token,
// prefix.public).
func CheckListen(prefix, addr, token string, public bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s.listen %q: %w", prefix, addr, err)
	}
	if token != "" || public || cp.IsLoopback(host) {
		return nil
	}
	return fmt.Errorf("%s.listen %q is not a loopback address: set %s.token (a bearer token scrapers must send), "+
		"or listen on 127.0.0.1, or set %s.public to serve it without credentials", prefix, addr, prefix, prefix)
}

// Check is one readiness condition: nil when it holds, else why not (the
// text /readyz answers with).
type Check func() error

// NATS is a readiness check: the connection to NATS is up.
func NATS(nc *nats.Conn) Check {
	return func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("NATS connection %s", strings.ToLower(nc.Status().String()))
		}
		return nil
	}
}

// Server serves a registry's metrics and the process's health. Its
// methods are safe for concurrent use.
type Server struct {
	reg *prometheus.Registry

	mu     sync.Mutex
	checks map[string]Check
}

// New returns a server for reg (nil: a new registry). The Go runtime and
// process collectors are added to reg unless it has them already.
func New(reg *prometheus.Registry) *Server {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err) // a programmer error: the collectors are constants
			}
		}
	}
	return &Server{reg: reg, checks: map[string]Check{}}
}

// Registry is the registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Ready sets readiness condition name (nil removes it).
func (s *Server) Ready(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c == nil {
		delete(s.checks, name)
		return
	}
	s.checks[name] = c
}

// NotReady returns why the process is not ready (each failing condition,
// by name, in name order), or nil when it is.
func (s *Server) NotReady() error {
	s.mu.Lock()
	names := make([]string, 0, len(s.checks))
	for n := range s.checks {
		names = append(names, n)
	}
	checks := make([]Check, len(names))
	sort.Strings(names)
	for i, n := range names {
		checks[i] = s.checks[n]
	}
	s.mu.Unlock()
	var errs []error
	for i, c := range checks {
		if err := c(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}

// Handler serves /metrics, /healthz and /readyz, asking for token when it
// is not empty.
func (s *Server) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := s.NotReady(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n%s\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if token == "" {
		return mux
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tandem"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Serve listens on o.Addr (after CheckListen, naming the settings under
// prefix in its errors) and serves until ctx ends. It returns once listening, with the
// address bound (for port 0), or with the error; done is closed when the
// server has stopped.
func (s *Server) Serve(ctx context.Context, prefix string, o Options) (addr string, done <-chan struct{}, err error) {
	if err := CheckListen(prefix, o.Addr, o.Token, o.Public); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return "", nil, fmt.Errorf("%s.listen: %w", prefix, err)
	}
	srv := &http.Server{Handler: s.Handler(o.Token), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = srv.Serve(ln) // ends with Shutdown below
	}()
	go func() {
		<-ctx.Done()
		// Scrapes are short: what is still running after a second is cut.
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			_ = srv.Close()
		}
	}()
	return ln.Addr().String(), stopped, nil
}

// Start serves the endpoint as Serve does when o.Addr is set (else it
// does nothing and returns ""), and logs its URL: the line operators and
// the process tests look for.
func (s *Server) Start(ctx context.Context, prefix string, o Options, log *zap.Logger) (string, error) {
	if o.Addr == "" {
		return "", nil
	}
	addr, _, err := s.Serve(ctx, prefix, o)
	if err != nil {
		return "", err
	}
	log.Info("metrics and health", zap.String("url", "http://"+addr+"/metrics"))
	return addr, nil
}
