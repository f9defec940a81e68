package images

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// FetchConfig is what the operator allows of image URLs.
type FetchConfig struct {
	// Allow lists the hosts images may come from: a name ("img.example.com")
	// or a domain and its subdomains ("*.example.com"). Empty: any host.
	// Whatever the list, only public addresses are dialled.
	Allow []string
	// Timeout bounds one fetch, redirects and body included (default 10 s).
	Timeout time.Duration
	// MaxBytes bounds the body (default: the image limit, Limits.Bytes).
	MaxBytes int64
	// permit lists addresses dialled although not public: tests only.
	permit []netip.Prefix
}

// WithPermitted returns c that also dials the addresses of p although they
// are not public. For tests, which serve images on loopback.
func (c FetchConfig) WithPermitted(p ...netip.Prefix) FetchConfig {
	c.permit = append(append([]netip.Prefix(nil), c.permit...), p...)
	return c
}

// DefaultFetchTimeout bounds a fetch when FetchConfig.Timeout is zero.
const DefaultFetchTimeout = 10 * time.Second

// maxRedirects bounds the redirects a fetch follows.
const maxRedirects = 3

// Fetcher gets images over http(s) for image_url parts: from allowed hosts
// only, never from a private, loopback, link-local or otherwise non-public
// address (checked on the address dialled, after name resolution, so a
// name that resolves to 10.0.0.1 or a redirect to one is refused too),
// through no proxy, within a size limit and a timeout.
type Fetcher struct {
	cfg    FetchConfig
	client *http.Client
}

// NewFetcher returns a Fetcher for cfg; maxBytes is the per-image limit
// that applies when cfg.MaxBytes is zero.
func NewFetcher(cfg FetchConfig, maxBytes int64) *Fetcher {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultFetchTimeout
	}
	if cfg.MaxBytes <= 0 || cfg.MaxBytes > maxBytes {
		cfg.MaxBytes = maxBytes
	}
	f := &Fetcher{cfg: cfg}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: f.control}
	tr := &http.Transport{
		Proxy:                 nil, // a proxy would be the address dialled, not the image's host
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConns:          16,
		IdleConnTimeout:       30 * time.Second,
	}
	f.client = &http.Client{Transport: tr, Timeout: cfg.Timeout, CheckRedirect: f.redirect}
	return f
}

// control runs for every connection the fetcher dials, with the address
// resolved: it refuses addresses that are not public.
func (f *Fetcher) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("images: dialling %q: not an IP address and port", address)
	}
	if a := ap.Addr().Unmap(); !Public(a) && !f.permitted(a) {
		return &blockedError{addr: a}
	}
	return nil
}

func (f *Fetcher) permitted(a netip.Addr) bool {
	for _, p := range f.cfg.permit {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// blockedError is a dial refused because its address is not public.
type blockedError struct{ addr netip.Addr }

func (e *blockedError) Error() string {
	return fmt.Sprintf("%s is not a public address (private, loopback, link-local or reserved); images are fetched from public addresses only", e.addr)
}

func (f *Fetcher) redirect(req *http.Request, via []*http.Request) error {
	if len(via) > maxRedirects {
		return fmt.Errorf("more than %d redirects", maxRedirects)
	}
	return f.checkURL(req.URL)
}

// checkURL checks a URL's scheme and host against the allow list.
func (f *Fetcher) checkURL(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q: only http and https are fetched", u.Scheme)
	}
	if u.User != nil {
		return errors.New("URLs with credentials are not fetched")
	}
	if !f.allowed(u.Hostname()) {
		return fmt.Errorf("host %q is not in http.images.fetch_allow", u.Hostname())
	}
	return nil
}

func (f *Fetcher) allowed(host string) bool {
	if len(f.cfg.Allow) == 0 {
		return true
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, a := range f.cfg.Allow {
		a = strings.ToLower(strings.TrimSuffix(a, "."))
		if d, ok := strings.CutPrefix(a, "*."); ok {
			if host == d || strings.HasSuffix(host, "."+d) {
				return true
			}
		} else if host == a {
			return true
		}
	}
	return false
}

// Get fetches image i from rawURL.
func (f *Fetcher) Get(ctx context.Context, i int, rawURL string) ([]byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, refuse(i, false, "image_url.url is not a URL: %v", err)
	}
	if err := f.checkURL(u); err != nil {
		return nil, refuse(i, false, "%s: %v", clip(rawURL), err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, refuse(i, false, "%s: %v", clip(rawURL), err)
	}
	req.Header.Set("Accept", "image/png, image/jpeg, image/gif, image/webp")
	resp, err := f.client.Do(req)
	if err != nil {
		var blocked *blockedError
		if errors.As(err, &blocked) {
			return nil, refuse(i, false, "%s: %v", clip(rawURL), blocked)
		}
		return nil, refuse(i, false, "fetching %s: %v", clip(rawURL), unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, refuse(i, false, "fetching %s: the server answered %s", clip(rawURL), resp.Status)
	}
	if resp.ContentLength > f.cfg.MaxBytes {
		return nil, refuse(i, true, "%s is %d bytes, at most %d allowed (http.images.fetch_max_bytes)", clip(rawURL), resp.ContentLength, f.cfg.MaxBytes)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, f.cfg.MaxBytes+1))
	if err != nil {
		return nil, refuse(i, false, "fetching %s: %v", clip(rawURL), unwrapURLError(err))
	}
	if int64(len(data)) > f.cfg.MaxBytes {
		return nil, refuse(i, true, "%s is more than %d bytes (http.images.fetch_max_bytes)", clip(rawURL), f.cfg.MaxBytes)
	}
	return data, nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// nonPublic are the IPv4 and IPv6 ranges beyond netip's own categories
// that a fetch must not reach: shared address space (carrier NAT), the
// IETF protocol assignments, benchmarking, documentation, reserved, and
// the IPv6 translation prefixes that embed an IPv4 address.
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
		"64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "2002::/16", "fec0::/10",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// Public reports whether a is a public unicast address: not private,
// loopback, link-local, multicast, unspecified or reserved.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() || !a.IsGlobalUnicast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}
