package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/natstest"
)

// TestCredentialsFiles: the first use of a directory creates the three
// identities with private permissions; later uses read the same ones;
// added clients and workers join them; a file others can read, or one
// that does not hold an identity, is refused by name.
func TestCredentialsFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tandem", "nats")
	ids, err := EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || Find(ids, PrincipalCoordinator) == nil || Find(ids, PrincipalWorker) == nil || Find(ids, PrincipalClient).Name != DefaultClient {
		t.Fatalf("identities %+v", ids)
	}
	if runtime.GOOS != "windows" {
		if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("directory %v %v, want mode 0700", st, err)
		}
		for _, p := range []Principal{PrincipalCoordinator, PrincipalWorker, PrincipalClient} {
			if st, err := os.Stat(IdentityFile(dir, p)); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v %v, want mode 0600", p, st, err)
			}
		}
	}
	again, err := EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if again[i] != ids[i] {
			t.Fatalf("second use: %+v, want %+v", again[i], ids[i])
		}
	}
	path, err := AddIdentity(dir, PrincipalClient, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AddIdentity(dir, PrincipalClient, "alice"); err == nil {
		t.Fatal("a client added twice")
	}
	if _, err := AddIdentity(dir, PrincipalClient, DefaultClient); err == nil {
		t.Fatal("the default client added again")
	}
	if _, err := AddIdentity(dir, PrincipalWorker, "gpu-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := AddIdentity(dir, PrincipalCoordinator, "two"); err == nil {
		t.Fatal("a second coordinator identity added")
	}
	all, err := EnsureCredentials(dir)
	if err != nil || len(all) != 5 {
		t.Fatalf("after adding: %d identities, %v", len(all), err)
	}
	alice, err := LoadIdentity(path)
	if err != nil || alice.Principal != PrincipalClient || alice.Name != "alice" || alice.User != "tandem-client-alice" {
		t.Fatalf("alice: %+v, %v", alice, err)
	}
	if _, err := ServerAuthorization(all); err != nil {
		t.Fatal(err)
	}

	if runtime.GOOS != "windows" {
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadIdentity(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("a world-readable identity file: %v", err)
		}
		if _, err := EnsureCredentials(dir); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("a world-readable identity file in the directory: %v", err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{
		"unknown field":  `{"principal":"client","name":"x","user":"u","password":"0123456789abcdef0123","admin":true}`,
		"short password": `{"principal":"client","name":"x","user":"u","password":"short"}`,
		"bad principal":  `{"principal":"root","user":"u","password":"0123456789abcdef0123"}`,
		"client no name": `{"principal":"client","user":"u","password":"0123456789abcdef0123"}`,
		"quote":          `{"principal":"worker","user":"u","password":"0123456789abcdef\"0123"}`,
		"not json":       `principal: client`,
	} {
		f := filepath.Join(t.TempDir(), "id.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadIdentity(f); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{"127.0.0.1": true, "localhost": true, "::1": true, "[::1]": true, "127.0.0.2": true,
		"0.0.0.0": false, "": false, "::": false, "10.0.0.10": false, "example.com": false} {
		if IsLoopback(host) != want {
			t.Errorf("IsLoopback(%q) = %v", host, !want)
		}
	}
}

// TestServerBeyondLoopback: an embedded server listening beyond loopback
// without credentials refuses to start, saying what to do; with
// identities, or explicitly insecure, it starts.
func TestServerBeyondLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := StartServer(ctx, ServerConfig{Host: "0.0.0.0", DataDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "beyond loopback") || !strings.Contains(err.Error(), "insecure") {
		t.Fatalf("open server on 0.0.0.0: %v", err)
	}
	for name, sc := range map[string]ServerConfig{
		"identities": {Host: "0.0.0.0", Identities: NewIdentities()},
		"insecure":   {Host: "0.0.0.0", Insecure: true},
	} {
		sc.DataDir = t.TempDir()
		s, err := StartServer(ctx, sc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := StartServer(ctx, ServerConfig{Identities: NewIdentities(), User: "u", Password: "p"}); err == nil {
		t.Fatal("identities and a single user at once")
	}
	dup := NewIdentities()
	dup[2].User = dup[1].User
	if _, err := StartServer(ctx, ServerConfig{Identities: dup}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a user given twice: %v", err)
	}
}

// TestIdentityConnections: over the embedded server and a real nats-server
// with ServerAuthorization's block, each identity connects with its own
// inbox and gets only its principal's subjects; no credentials, no entry.
func TestIdentityConnections(t *testing.T) {
	ids := NewIdentities()
	block, err := ServerAuthorization(ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"embedded", "process"} {
		t.Run(kind, func(t *testing.T) {
			var url string
			if kind == "embedded" {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				s, err := StartServer(ctx, ServerConfig{DataDir: t.TempDir(), Identities: ids})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
				url = s.ClientURL()
			} else {
				url = startAuthorized(t, block, &ids[0])
			}
			coord := connect(t, Options{URL: url, Identity: Find(ids, PrincipalCoordinator)})
			client := connect(t, Options{URL: url, Identity: Find(ids, PrincipalClient)})
			if got := ClientName(client); got != DefaultClient {
				t.Fatalf("ClientName %q", got)
			}
			// The client's request reaches the coordinator, and the reply its
			// own inbox.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := Serve(ctx, coord, SubjectAllCancel, "", func(ctx context.Context, req *CancelRequest) (*CancelReply, error) {
				name, err := ClientOf(RequestSubject(ctx))
				if err != nil {
					return nil, err
				}
				return &CancelReply{JobID: req.JobID, State: StateCancelled}, checkName(name)
			}); err != nil {
				t.Fatal(err)
			}
			if rep, err := Cancel(ctx, client, "j-1", ""); err != nil || rep.State != StateCancelled {
				t.Fatalf("a client's request: %+v, %v", rep, err)
			}
			refused(t, Options{URL: url}, "no credentials", notAuthorized)
			refused(t, Options{URL: url, User: ids[2].User, Password: ids[1].Password}, "another identity's password", notAuthorized)
		})
	}
}

func checkName(name string) error {
	if name != DefaultClient {
		return &RemoteError{Code: CodeBadRequest, Message: "request from " + name}
	}
	return nil
}

// startAuthorized runs a real nats-server with the authorization block and
// returns its URL once JetStream answers as identity id.
// onBothServers runs fn as a subtest on the embedded server with ids and on
// a nats-server process configured by ServerAuthorization's block for ids
// (ids[0] the coordinator, who checks it is up), each with a 60 s context.
func onBothServers(t *testing.T, ids []Identity, fn func(t *testing.T, ctx context.Context, url string)) {
	block, err := ServerAuthorization(ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"embedded", "process"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var url string
			if kind == "embedded" {
				s, err := StartServer(ctx, ServerConfig{DataDir: t.TempDir(), Identities: ids})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
				url = s.ClientURL()
			} else {
				url = startAuthorized(t, block, &ids[0])
			}
			fn(t, ctx, url)
		})
	}
}

func startAuthorized(t *testing.T, block string, id *Identity) string {
	t.Helper()
	return natstest.Start(t, natstest.Config{Extra: block, Ready: func(url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nc, err := Connect(ctx, Options{URL: url, Identity: id, ConnectTimeout: 2 * time.Second})
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
		return err
	}})
}
