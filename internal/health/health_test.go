package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		public      bool
		ok          bool
	}{
		{"127.0.0.1:9464", "", false, true},
		{"localhost:0", "", false, true},
		{"[::1]:9464", "", false, true},
		{"0.0.0.0:9464", "", false, false},
		{":9464", "", false, false},
		{"10.0.0.5:9464", "", false, false},
		{"0.0.0.0:9464", "s3cret", false, true},
		{"0.0.0.0:9464", "", true, true},
		{"no-port", "", false, false},
	} {
		err := CheckListen("metrics", tc.addr, tc.token, tc.public)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, token %q, public %v) = %v, want ok %v", tc.addr, tc.token, tc.public, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "metrics.listen") {
			t.Errorf("CheckListen(%q): %v does not name the setting", tc.addr, err)
		}
	}
	err := CheckListen("metrics", "0.0.0.0:9464", "", false)
	for _, want := range []string{"metrics.token", "metrics.public", "127.0.0.1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
}

// TestServe serves a registry over a real socket: /healthz, /readyz as
// its checks say, /metrics with the registry's and the runtime's metrics,
// and a bearer token when one is set.
func TestServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "tandem_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Add(3)
	s := New(reg)
	var why error = errors.New("loading the model")
	s.Ready("model", func() error { return why })
	s.Ready("nats", func() error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	addr, done, err := s.Serve(ctx, "metrics", Options{Addr: "127.0.0.1:0", Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr
	get := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		for _, tok := range []string{"", "wrong"} {
			if code, _ := get(p, tok); code != http.StatusUnauthorized {
				t.Errorf("%s with token %q: %d, want 401", p, tok, code)
			}
		}
	}
	if code, body := get("/healthz", "tok"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz", "tok"); code != http.StatusServiceUnavailable || !strings.Contains(body, "model: loading the model") || strings.Contains(body, "nats") {
		t.Errorf("/readyz while loading: %d %q", code, body)
	}
	why = nil
	if code, body := get("/readyz", "tok"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	code, body := get("/metrics", "tok")
	if code != 200 || !strings.Contains(body, "tandem_test_things_total 3\n") || !strings.Contains(body, "go_goroutines ") ||
		!strings.Contains(body, "process_start_time_seconds ") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if _, _, err := s.Serve(ctx, "metrics", Options{Addr: "0.0.0.0:0"}); err == nil {
		t.Error("an unauthenticated listener beyond loopback was allowed")
	}
	cancel()
	<-done
}
