package images

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestPublic(t *testing.T) {
	for s, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700:4700::1111": true,
		"127.0.0.1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false, "169.254.169.254": false,
		"100.64.0.1": false, "0.0.0.0": false, "255.255.255.255": false, "224.0.0.1": false, "198.18.0.1": false,
		"::1": false, "::": false, "fe80::1": false, "fc00::1": false, "fd12::1": false, "ff02::1": false,
		"::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false, "64:ff9b::a00:1": false, "2002:a00:1::": false, "2001:db8::1": false,
	} {
		if got := Public(netip.MustParseAddr(s)); got != want {
			t.Errorf("Public(%s) = %v, want %v", s, got, want)
		}
	}
}

// imageServer serves a PNG at /a.png, a redirect to elsewhere at /moved,
// and a body larger than any limit at /big.
func imageServer(t *testing.T, elsewhere string) (*httptest.Server, []byte) {
	data := pngOf(t, 20, 20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/a.png":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(data)
		case "/moved":
			http.Redirect(w, r, elsewhere, http.StatusFound)
		case "/big":
			_, _ = w.Write(bytes.Repeat([]byte{0}, 1<<20))
		case "/slow":
			<-r.Context().Done() // until the client gives up
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, data
}

func TestFetchRefusesPrivateAddresses(t *testing.T) {
	srv, _ := imageServer(t, "")
	for _, u := range []string{srv.URL + "/a.png", strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/a.png"} {
		f := NewFetcher(FetchConfig{}, 1<<20)
		_, err := f.Get(t.Context(), 0, u)
		if err == nil || IsTooLarge(err) || !strings.Contains(err.Error(), "is not a public address") {
			t.Errorf("%s: error %v, want a refusal of a private address", u, err)
		}
	}
}

func TestFetchAllowed(t *testing.T) {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	srv, data := imageServer(t, "http://elsewhere.example/a.png")
	cfg := FetchConfig{Allow: []string{"127.0.0.1"}, MaxBytes: 4096}.WithPermitted(loopback)
	f := NewFetcher(cfg, 1<<20)
	got, err := f.Get(t.Context(), 0, srv.URL+"/a.png")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes, %v", len(got), err)
	}
	for _, tc := range []struct {
		path, want string
		tooLarge   bool
	}{
		{"/big", "more than 4096 bytes", true},
		{"/moved", `host "elsewhere.example" is not in http.images.fetch_allow`, false},
		{"/missing", "404 Not Found", false},
	} {
		_, err := f.Get(t.Context(), 2, srv.URL+tc.path)
		if err == nil || IsTooLarge(err) != tc.tooLarge || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.path, err, tc.want)
		}
	}
	other := NewFetcher(FetchConfig{Allow: []string{"*.example.com"}}.WithPermitted(loopback), 1<<20)
	if _, err := other.Get(t.Context(), 0, srv.URL+"/a.png"); err == nil || !strings.Contains(err.Error(), "not in http.images.fetch_allow") {
		t.Errorf("host off the list: %v", err)
	}
	if !other.allowed("img.example.com") || !other.allowed("example.com") || other.allowed("badexample.com") {
		t.Error("*.example.com matches wrongly")
	}
	slow := NewFetcher(FetchConfig{Timeout: 200 * time.Millisecond}.WithPermitted(loopback), 1<<20)
	if _, err := slow.Get(t.Context(), 0, srv.URL+"/slow"); err == nil || !strings.Contains(err.Error(), "fetching") {
		t.Errorf("slow server: %v", err)
	}
}
