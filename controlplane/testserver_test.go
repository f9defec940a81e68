package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// security is the authentication and TLS a test server requires; the same
// settings drive the embedded server and a real nats-server process.
type security struct {
	User, Password string
	Token          string
	NKeys          []string
	TLS            *TLSFiles // the server's files
	ClientTLS      *TLSFiles // what a rightful client uses
	ClientSeed     string    // nkey seed file of a rightful client
}

// testServer is a running NATS server for a test, of either kind.
type testServer struct {
	kind string // "embedded" or "process"
	url  string
}

// serverKinds runs f against the embedded server and against a real
// nats-server process (skipped, with the reason, when the binary is absent).
func serverKinds(t *testing.T, sec security, f func(t *testing.T, srv testServer)) {
	t.Run("embedded", func(t *testing.T) { f(t, startEmbedded(t, sec)) })
	t.Run("process", func(t *testing.T) { f(t, startProcess(t, sec)) })
}

func startEmbedded(t testing.TB, sec security) testServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := StartServer(ctx, ServerConfig{
		DataDir: t.TempDir(), User: sec.User, Password: sec.Password, Token: sec.Token, NKeys: sec.NKeys, TLS: sec.TLS,
	})
	if err != nil {
		t.Fatalf("start embedded server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return testServer{kind: "embedded", url: s.ClientURL()}
}

// findTool finds a pinned NATS tool in <repo>/bin, then on PATH, or skips.
func findTool(t testing.TB, name string) string {
	t.Helper()
	if dir, err := os.Getwd(); err == nil {
		for d := dir; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				p := filepath.Join(d, "bin", name)
				if _, err := os.Stat(p); err == nil {
					return p
				}
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Skipf("%s not found in <repo>/bin or on PATH: run scripts/install-nats.sh to install the pinned NATS tools", name)
	return ""
}

// startProcess runs a real nats-server on a random loopback port with
// JetStream in a temporary directory, and kills it when the test ends.
func startProcess(t testing.TB, sec security) testServer {
	t.Helper()
	bin := findTool(t, "nats-server")
	dir := t.TempDir()
	var conf strings.Builder
	fmt.Fprintf(&conf, "listen: \"127.0.0.1:-1\"\nmax_payload: %d\njetstream {\n  store_dir: %q\n}\n", DefaultMaxPayload, filepath.Join(dir, "js"))
	switch {
	case sec.Token != "":
		fmt.Fprintf(&conf, "authorization {\n  token: %q\n}\n", sec.Token)
	case sec.User != "" || len(sec.NKeys) > 0:
		conf.WriteString("authorization {\n  users: [\n")
		if sec.User != "" {
			fmt.Fprintf(&conf, "    {user: %q, password: %q}\n", sec.User, sec.Password)
		}
		for _, k := range sec.NKeys {
			fmt.Fprintf(&conf, "    {nkey: %q}\n", k)
		}
		conf.WriteString("  ]\n}\n")
	}
	scheme := "nats"
	if sec.TLS != nil {
		scheme = "tls"
		fmt.Fprintf(&conf, "tls {\n  cert_file: %q\n  key_file: %q\n", sec.TLS.Cert, sec.TLS.Key)
		if sec.TLS.CA != "" {
			fmt.Fprintf(&conf, "  ca_file: %q\n  verify: true\n", sec.TLS.CA)
		}
		conf.WriteString("}\n")
	}
	confPath := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	portsDir := filepath.Join(dir, "ports")
	if err := os.Mkdir(portsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	var logMu sync.Mutex
	cmd := exec.Command(bin, "-c", confPath, "--ports_file_dir", portsDir)
	cmd.Stdout, cmd.Stderr = lockedWriter{&logMu, &log}, lockedWriter{&logMu, &log}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	portsFile := filepath.Join(portsDir, fmt.Sprintf("%s_%d.ports", filepath.Base(bin), cmd.Process.Pid))
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(portsFile); err == nil {
			var ports struct{ Nats []string }
			if json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 {
				u := ports.Nats[0]
				if i := strings.Index(u, "://"); i >= 0 {
					u = u[i+3:]
				}
				addr := scheme + "://" + u
				waitJetStream(t, addr, sec)
				return testServer{kind: "process", url: addr}
			}
		}
		select {
		case <-exited:
			logMu.Lock()
			defer logMu.Unlock()
			t.Fatalf("nats-server exited before listening:\n%s", log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			logMu.Lock()
			defer logMu.Unlock()
			t.Fatalf("nats-server wrote no ports file in 20s:\n%s", log.String())
		}
	}
}

// waitJetStream waits until the process answers JetStream API requests.
func waitJetStream(t testing.TB, url string, sec security) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		nc, err := Connect(ctx, clientOptions(url, sec))
		cancel()
		if err == nil {
			_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
			nc.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server at %s not ready: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clientOptions are the right credentials for a server set up with sec.
func clientOptions(url string, sec security) Options {
	o := Options{URL: url, Name: "test", User: sec.User, Password: sec.Password, Token: sec.Token, ConnectTimeout: 2 * time.Second, MaxReconnects: -1}
	o.TLS, o.NKeySeedFile = sec.ClientTLS, sec.ClientSeed
	return o
}

func connect(t testing.TB, o Options) *nats.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := Connect(ctx, o)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// lockedWriter collects a process's stdout and stderr, written from two
// goroutines.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, written as PEM files.
type testPKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	// OtherCA signed nothing we use: a client trusting only it must fail.
	OtherCA string
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert, caDER := newCA(t, "tandem test CA")
	_, _, otherDER := newCA(t, "unrelated CA")
	p := testPKI{
		CA:      writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER),
		OtherCA: writePEM(t, dir, "other-ca.pem", "CERTIFICATE", otherDER),
	}
	p.ServerCert, p.ServerKey = issue(t, dir, "server", caKey, caCert, x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey = issue(t, dir, "client", caKey, caCert, x509.ExtKeyUsageClientAuth)
	return p
}

func newCA(t testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func issue(t testing.TB, dir, name string, caKey *ecdsa.PrivateKey, ca *x509.Certificate, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name+".pem", "CERTIFICATE", der), writePEM(t, dir, name+"-key.pem", "PRIVATE KEY", keyDER)
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
