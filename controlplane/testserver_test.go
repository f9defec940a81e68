package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"github.com/tandem-inference/tandem/internal/natstest"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
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

// startProcess runs a real nats-server on a random loopback port with
// JetStream in a temporary directory, set up with sec, and kills it when
// the test ends.
func startProcess(t testing.TB, sec security) testServer {
	t.Helper()
	var conf strings.Builder
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
	url := natstest.Start(t, natstest.Config{Extra: conf.String(), Scheme: scheme, Ready: func(url string) error {
		// JetStream answers a client with the right credentials.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nc, err := Connect(ctx, clientOptions(url, sec))
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
		return err
	}})
	return testServer{kind: "process", url: url}
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
