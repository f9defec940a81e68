// Package openai is tandem's OpenAI-compatible HTTP front door: chat and
// text completions (streamed as server-sent events or not), the model list
// and a health check. Each request becomes an ordinary job submitted with
// coordinator/client, so routing, cancellation, limits and metrics are the
// coordinator's; the front door keeps no job state and several can serve
// one deployment. Chat prompts are rendered here in K3's released
// conversation format (tokenizer.EncodeChat), and the reply is read back
// token by token (tokenizer.ReplyParser) into reasoning, content and tool
// calls.
package openai

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/internal/bytebudget"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Config configures a front door. Zero values take the defaults named.
type Config struct {
	// Conn is the NATS connection jobs are submitted on.
	Conn *nats.Conn
	// Model and Tokenizer are the served model's (the coordinator's).
	Model     *modelinfo.Info
	Tokenizer *tokenizer.Tokenizer
	// ModelName is the name clients use (default: Model.ID); requests may
	// also name Model.ID.
	ModelName string
	// APIKeys are the accepted bearer keys; none: no authentication (only
	// allowed on loopback, see CheckListen).
	APIKeys []string
	// MaxBodyBytes bounds a request body (default 16 MiB).
	MaxBodyBytes int64
	// MaxPromptTokens bounds a prompt (0: the model's context length; the
	// coordinator applies its own limit too).
	MaxPromptTokens int
	// MaxConcurrentPerKey bounds the requests one key has in flight
	// (default 64); without keys it bounds all requests together.
	MaxConcurrentPerKey int
	// BodyTimeout bounds the reading of a request body, from the end of
	// its headers (default 30 s): a body not in by then is answered 408.
	// The body is read before the request takes one of its key's slots,
	// so a slow body holds no slot.
	BodyTimeout time.Duration
	// Budget bounds the bytes of request bodies held at once, counted as
	// they arrive, from the first byte until the body is decoded; a body
	// that does not fit is answered 503 at once. `coordinator serve`
	// passes the coordinator's submission budget (service.Config.Budget),
	// so the NATS path and the HTTP path share one bound. Nil: a budget
	// of its own, DefaultBodyBudget and at least MaxBodyBytes.
	Budget *bytebudget.Budget
	// Images bound a request's images (zero fields: images.DefaultLimits).
	Images images.Limits
	// ImageFetch, when set, lets image_url parts name http(s) URLs, which
	// the front door fetches as it says; nil: only data: URLs are read.
	ImageFetch *images.FetchConfig
	// Policy routes the jobs (empty: the coordinator's default).
	Policy cp.Policy
	Log    *zap.Logger
}

// Defaults.
const (
	DefaultMaxBodyBytes        = 16 << 20
	DefaultMaxConcurrentPerKey = 64
	DefaultBodyTimeout         = 30 * time.Second
	DefaultBodyBudget          = 64 << 20
)

// Server is a front door. Its handler is safe for concurrent use.
type Server struct {
	cfg     Config
	plan    planner
	images  *images.Reader // reads image_url parts
	keys    [][32]byte     // SHA-256 of each key: compared in constant time
	workers *availability
	log     *zap.Logger
	created int64

	mu       sync.Mutex
	inFlight map[string]int // per key
}

// New returns a front door; Run starts its registry watch.
func New(cfg Config) (*Server, error) {
	if cfg.Conn == nil || cfg.Model == nil {
		return nil, errors.New("openai: Conn and Model are required")
	}
	if cfg.ModelName == "" {
		cfg.ModelName = cfg.Model.ID
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxConcurrentPerKey <= 0 {
		cfg.MaxConcurrentPerKey = DefaultMaxConcurrentPerKey
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.Budget == nil {
		cfg.Budget = bytebudget.New(max(DefaultBodyBudget, cfg.MaxBodyBytes))
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	cfg.Images = cfg.Images.OrDefault()
	s := &Server{cfg: cfg, log: cfg.Log, created: time.Now().Unix(), inFlight: map[string]int{},
		plan:    planner{name: cfg.ModelName, info: cfg.Model, tok: cfg.Tokenizer, maxPrompt: cfg.MaxPromptTokens, images: cfg.Images},
		images:  &images.Reader{Limits: cfg.Images},
		workers: newAvailability(cfg.Conn, cfg.Model.ID)}
	for i, k := range cfg.APIKeys {
		if strings.TrimSpace(k) == "" || strings.ContainsAny(k, " \t\r\n") {
			return nil, fmt.Errorf("openai: API key %d is empty or has whitespace", i)
		}
		s.keys = append(s.keys, sha256.Sum256([]byte(k)))
	}
	if cfg.ImageFetch != nil {
		s.images.Fetch = images.NewFetcher(*cfg.ImageFetch, cfg.Images.Bytes)
	}
	return s, nil
}

// CheckListen refuses an address beyond loopback without API keys: a
// front door open to the network must ask for credentials.
func CheckListen(addr string, keys []string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("http.listen %q: %w", addr, err)
	}
	if len(keys) > 0 || cp.IsLoopback(host) {
		return nil
	}
	return fmt.Errorf("http.listen %q is not a loopback address: give http.api_keys (bearer keys clients must send), or listen on 127.0.0.1", addr)
}

// Serve listens on addr and serves until ctx ends; ready (if not nil)
// receives the bound address once it listens.
func (s *Server) Serve(ctx context.Context, addr string, ready func(string)) error {
	if err := CheckListen(addr, s.cfg.APIKeys); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	return s.ServeListener(ctx, ln, ready)
}

// ServeListener serves on ln until ctx ends.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener, ready func(string)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	// Requests in flight end with the context (their jobs are cancelled).
	sctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_ = hs.Shutdown(sctx)
	return nil
}

// Handler routes the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.guard(s.chatCompletions))
	mux.HandleFunc("POST /v1/completions", s.guard(s.completions))
	mux.HandleFunc("GET /v1/models", s.guard(s.models))
	mux.HandleFunc("GET /v1/models/{model}", s.guard(s.model))
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, newErr(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"no route %s %s (this server serves /v1/chat/completions, /v1/completions, /v1/models, /health)", r.Method, r.URL.Path))
	})
	return mux
}

// guard authenticates a request, reads its body (readBody), and only then
// holds one of its key's request slots while it runs: a client that sends
// its body slowly, or not at all, holds no slot.
func (s *Server) guard(h func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, err := s.authenticate(r)
		if err != nil {
			writeError(w, err)
			return
		}
		body, err := s.readBody(w, r)
		if err != nil {
			// The body is not read to its end: the connection cannot
			// carry another request. Flushed now, or the server, seeing
			// the failed read, would not send the answer at all.
			w.Header().Set("Connection", "close")
			writeError(w, err)
			_ = http.NewResponseController(w).Flush()
			return
		}
		defer body.release()
		if !s.acquire(key) {
			writeError(w, newErr(http.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", "",
				"too many requests in flight for this key (at most %d at once)", s.cfg.MaxConcurrentPerKey))
			return
		}
		defer s.release(key)
		r.Body = body
		h(w, r)
	}
}

// heldBody is a request body read in full, its bytes held in the budget
// until release (decodeBody releases them once decoded).
type heldBody struct {
	*bytes.Reader
	once    sync.Once
	budget  *bytebudget.Budget
	held    int64
	dropBuf func()
}

func (b *heldBody) Close() error { return nil }

// release gives the body's bytes back to the budget; later calls do
// nothing.
func (b *heldBody) release() {
	b.once.Do(func() {
		b.budget.Release(b.held)
		b.dropBuf()
	})
}

// bodyChunk is the first buffer a body is read into; the buffer doubles
// from there, each growth taken from the budget before it is allocated.
const bodyChunk = 32 << 10

// readBody reads r's body in full within BodyTimeout of now, at most
// MaxBodyBytes of it (413 past that, 408 when it is not in by the
// deadline), holding its buffer in the budget as it grows (503 when the
// budget has no room: retry). The returned body must be released.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (*heldBody, *apiError) {
	limit := s.cfg.MaxBodyBytes
	tooLarge := func() *apiError {
		return newErr(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
			"the request body exceeds %d bytes", limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	if r.ContentLength == 0 { // GET /v1/models: nothing to hold
		b := &heldBody{Reader: bytes.NewReader(nil), budget: s.cfg.Budget}
		b.dropBuf = func() {}
		return b, nil
	}
	rc := http.NewResponseController(w)
	// Not every ResponseWriter has a connection (tests' recorders).
	if err := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)); err == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	var buf []byte
	held := int64(0)
	fail := func(e *apiError) (*heldBody, *apiError) {
		s.cfg.Budget.Release(held)
		return nil, e
	}
	for {
		if len(buf) == cap(buf) {
			// Room for one byte past the limit, to tell a body of
			// exactly the limit from a larger one.
			next := min(max(2*int64(cap(buf)), bodyChunk), limit+1)
			if r.ContentLength >= 0 {
				next = min(next, r.ContentLength+1)
			}
			if next <= int64(cap(buf)) {
				return fail(tooLarge())
			}
			grow := next - int64(cap(buf))
			if !s.cfg.Budget.TryTake(grow) {
				return fail(newErr(http.StatusServiceUnavailable, "service_unavailable", "overloaded", "",
					"the server holds %d bytes of requests, at most %d at once; retry later", s.cfg.Budget.Held(), s.cfg.Budget.Limit()))
			}
			held += grow
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return fail(tooLarge())
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				return fail(newErr(http.StatusRequestTimeout, "invalid_request_error", "request_timeout", "",
					"the request body did not arrive within %v", s.cfg.BodyTimeout))
			}
			return fail(badRequest("", "reading the request body: %v", err))
		}
	}
	b := &heldBody{Reader: bytes.NewReader(buf), budget: s.cfg.Budget, held: held}
	b.dropBuf = func() { b.Reader = bytes.NewReader(nil) }
	return b, nil
}

// authenticate returns the key's slot name ("" without keys).
func (s *Server) authenticate(r *http.Request) (string, *apiError) {
	if len(s.keys) == 0 {
		return "", nil
	}
	auth := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		return "", newErr(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
			"missing API key: send it as Authorization: Bearer KEY")
	}
	sum := sha256.Sum256([]byte(token))
	for i, k := range s.keys {
		if subtle.ConstantTimeCompare(sum[:], k[:]) == 1 {
			return fmt.Sprintf("key-%d", i), nil
		}
	}
	return "", newErr(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "", "incorrect API key")
}

func (s *Server) acquire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[key] >= s.cfg.MaxConcurrentPerKey {
		return false
	}
	s.inFlight[key]++
	return true
}

func (s *Server) release(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[key]--; s.inFlight[key] <= 0 {
		delete(s.inFlight, key)
	}
}

func (s *Server) card() modelCard {
	return modelCard{ID: s.cfg.ModelName, Object: "model", Created: s.created, OwnedBy: "tandem",
		ContextLength: s.cfg.Model.MaxPositions, MaxModelLen: s.cfg.Model.MaxPositions}
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{s.card()}})
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	if err := s.plan.checkModel(r.PathValue("model")); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.card())
}

// health answers 200 when NATS is connected and the coordinators say a
// decode group serves the model, 503 otherwise; it needs no key (load
// balancers probe it).
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	type status struct {
		Status  string `json:"status"`
		Model   string `json:"model"`
		NATS    bool   `json:"nats"`
		Workers *int   `json:"decode_workers"` // null: no coordinator answered
		Reason  string `json:"reason,omitempty"`
	}
	st := status{Status: "ok", Model: s.cfg.ModelName, NATS: s.cfg.Conn.IsConnected()}
	n, known := s.workers.ranks(r.Context())
	if known {
		st.Workers = &n
	}
	code := http.StatusOK
	switch {
	case !st.NATS:
		st.Reason = "not connected to NATS"
	case !known:
		st.Reason = errNoAnswer.Error()
	case n == 0:
		if e := s.workers.check(r.Context()); e != nil {
			st.Reason = e.Message
		}
	}
	if st.Reason != "" {
		st.Status, code = "unavailable", http.StatusServiceUnavailable
	}
	writeJSON(w, code, st)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the response failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, errorBody{Error: e})
}

// decodeBody reads a JSON body into v, answering 413 past the body limit
// and 400 for anything that is not the expected JSON.
func decodeBody(r *http.Request, v any) *apiError {
	if b, ok := r.Body.(*heldBody); ok {
		defer b.release() // decoded: the raw bytes are no longer needed
	}
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return newErr(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
				"the request body exceeds %d bytes", mbe.Limit)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return badRequest(te.Field, "%s: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return badRequest("", "the body is not a valid JSON request: %v", err)
	}
	if dec.More() {
		return badRequest("", "the body holds more than one JSON value")
	}
	return nil
}

// ModelName is the name a model is served under by default: its
// directory's name, or its configuration's id.
func ModelName(dir string, info *modelinfo.Info) string {
	if b := filepath.Base(filepath.Clean(dir)); dir != "" && b != "." && b != string(filepath.Separator) {
		return b
	}
	return info.ID
}

// CurlLine is a ready-to-paste command that streams a chat completion from
// the API at addr.
func CurlLine(addr, model, key string) string {
	auth := ""
	if key != "" {
		auth = ` -H "Authorization: Bearer ` + key + `"`
	}
	return `curl -N http://` + addr + `/v1/chat/completions -H "Content-Type: application/json"` + auth +
		` -d '{"model": "` + model + `", "stream": true, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello"}]}'`
}
