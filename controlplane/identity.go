package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"
)

// Principal is the kind of a NATS identity of a tandem deployment. Each
// kind gets its own subject permissions, enforced by the NATS server, so
// that a client cannot read another client's jobs, see a transfer secret
// or speak for a worker; Permissions lists them.
type Principal string

const (
	// PrincipalCoordinator runs jobs and owns the job queue and the
	// registry: it may publish and subscribe everywhere.
	PrincipalCoordinator Principal = "coordinator"
	// PrincipalWorker is a prefill worker or a decode rank: it takes
	// assignments, reports progress, publishes tokens and beats.
	PrincipalWorker Principal = "worker"
	// PrincipalClient submits jobs and follows its own jobs only.
	PrincipalClient Principal = "client"
)

// DefaultClient is the client name of a connection that names none, and
// of the client identity generated for this machine.
const DefaultClient = "local"

// Identity is one NATS user of a tandem deployment: who it is, Principal
// and Name, and how it logs in, User and Password. A client's Name is its
// subject namespace, ClientPrefix; a worker's Name, when set, is the one
// worker id it may serve, and when empty it may serve any. SaveIdentity
// stores identities one per file, as JSON, with 0600 permissions.
type Identity struct {
	Principal Principal `json:"principal"`
	Name      string    `json:"name,omitempty"`
	User      string    `json:"user"`
	Password  string    `json:"password"`
}

// Validate checks that the identity is complete and its name a protocol id.
func (id *Identity) Validate() error {
	switch id.Principal {
	case PrincipalCoordinator:
	case PrincipalClient:
		if err := CheckID(id.Name); err != nil {
			return fmt.Errorf("client identity %q: name: %w", id.User, err)
		}
	case PrincipalWorker:
		if id.Name != "" {
			if err := CheckID(id.Name); err != nil {
				return fmt.Errorf("worker identity %q: name: %w", id.User, err)
			}
		}
	default:
		return fmt.Errorf("identity %q: principal %q, want coordinator, worker or client", id.User, id.Principal)
	}
	if err := CheckID(id.User); err != nil {
		return fmt.Errorf("%s identity: user: %w", id.Principal, err)
	}
	for i := 0; i < len(id.Password); i++ {
		if c := id.Password[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' || c == '\'' {
			return fmt.Errorf("%s identity %q: password has %q at byte %d: printable ASCII without quotes or backslashes only", id.Principal, id.User, c, i)
		}
	}
	switch {
	case len(id.Password) < 16:
		return fmt.Errorf("%s identity %q: password of %d characters, at least 16 required", id.Principal, id.User, len(id.Password))
	}
	return nil
}

// NewIdentity makes an identity with a fresh random 160-bit password.
// The user name is "tandem-" + principal, and "-" + name when named.
func NewIdentity(p Principal, name string) Identity {
	user := "tandem-" + string(p)
	if name != "" {
		user += "-" + name
	}
	return Identity{Principal: p, Name: name, User: user, Password: randomToken(20)}
}

// NewIdentities makes the three identities of a deployment on one machine
// or under one operator: the coordinator, a worker identity every worker
// shares, and the client DefaultClient.
func NewIdentities() []Identity {
	return []Identity{NewIdentity(PrincipalCoordinator, ""), NewIdentity(PrincipalWorker, ""), NewIdentity(PrincipalClient, DefaultClient)}
}

// Find returns the first identity of principal p, or nil when none.
func Find(ids []Identity, p Principal) *Identity {
	for i := range ids {
		if ids[i].Principal == p {
			return &ids[i]
		}
	}
	return nil
}

// ClientPrefix is the subject namespace of client name: its requests and
// its jobs' events and tokens live under it, and only it and the
// coordinator may read there.
func ClientPrefix(name string) string { return Prefix + ".clients." + name }

// InboxPrefix is the reply-inbox prefix a connection of identity p, named
// name, uses. Clients and workers may subscribe only to their own, so that
// no one reads another's replies. The coordinator keeps NATS's default.
func InboxPrefix(p Principal, name string) string {
	switch p {
	case PrincipalClient:
		return "_INBOX.client." + name
	case PrincipalWorker:
		if name == "" {
			name = "any" // the shared worker identity may use any worker's
		}
		return "_INBOX.worker." + name
	}
	return "_INBOX" // nats.go's default
}

// Permissions are the subjects identity p, named name, may publish to and
// subscribe to; they are the whole of tandem's access control on NATS. A
// client reaches only its own requests, namespace and inbox. A worker
// takes and answers requests on its own subjects, any worker's for the
// shared worker identity, reports progress, publishes tokens into clients'
// namespaces and keeps its registry key; it can read neither the job queue
// nor other clients' requests or job events, and change no stream or
// bucket. The coordinator may do everything.
// docs/ARCHITECTURE.md, "Security", says what each identity is trusted with.
func Permissions(p Principal, name string) *server.Permissions {
	switch p {
	case PrincipalClient:
		ns := ClientPrefix(name)
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{ns + ".submit", ns + ".cancel", ns + ".list", ns + ".availability"}},
			Subscribe: &server.SubjectPermission{Allow: []string{ns + ".jobs.>", InboxPrefix(p, name) + ".>"}},
		}
	case PrincipalWorker:
		w := name
		if w == "" {
			w = "*"
		}
		bucket := "KV_" + WorkersBucket
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{
				Prefix + ".workers." + w + ".jobs.*.progress",
				Prefix + ".clients.*.jobs.*.tokens",
				// Its heartbeat: a put (or, leaving, a delete) of its
				// registry key, on the bucket bound with one stream
				// info (JoinRegistry). No other JetStream API: a
				// worker that could create or update the bucket's
				// stream could give it other subjects and republish
				// them (clients' requests and events) to its inbox.
				"$KV." + WorkersBucket + "." + w,
				"$JS.API.STREAM.INFO." + bucket,
			}},
			Subscribe: &server.SubjectPermission{Allow: []string{
				Prefix + ".workers." + w + ".assign",
				Prefix + ".workers." + w + ".cancel",
				Prefix + ".workers." + w + ".status",
				Prefix + ".workers." + w + ".drain",
				Prefix + ".workers." + w + ".cache",
				"_INBOX.worker." + w + ".>",
			}},
			// Answers to the coordinator's requests (assign, cancel, status, drain, cache).
			Response: &server.ResponsePermission{MaxMsgs: 1},
		}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{">"}},
		Subscribe: &server.SubjectPermission{Allow: []string{">"}},
	}
}

// serverUsers turns identities into the embedded server's users.
func serverUsers(ids []Identity) ([]*server.User, error) {
	seen := map[string]bool{}
	var out []*server.User
	for i := range ids {
		id := &ids[i]
		if err := id.Validate(); err != nil {
			return nil, fmt.Errorf("nats server: identities[%d]: %w", i, err)
		}
		if seen[id.User] {
			return nil, fmt.Errorf("nats server: identities[%d]: user %q given twice", i, id.User)
		}
		seen[id.User] = true
		// A hash, as the server prefers; the cheapest cost, since the
		// process holds the passwords anyway.
		hash, err := bcrypt.GenerateFromPassword([]byte(id.Password), bcrypt.MinCost)
		if err != nil {
			return nil, fmt.Errorf("nats server: identities[%d]: %w", i, err)
		}
		out = append(out, &server.User{Username: id.User, Password: string(hash), Permissions: Permissions(id.Principal, id.Name)})
	}
	return out, nil
}

// ServerAuthorization is the authorization block of a nats-server
// configuration file that gives ids exactly the permissions the embedded
// server gives them, with passwords as bcrypt hashes. It is how tandem runs
// on a NATS deployment of one's own; `coordinator credentials
// --nats-server-conf` writes it.
func ServerAuthorization(ids []Identity) (string, error) {
	if _, err := serverUsers(ids); err != nil {
		return "", err
	}
	// Subjects, user names and passwords are printable ASCII without
	// quotes (Validate, CheckID, randomToken): Go's quoting is the
	// configuration format's.
	q := func(s []string) string {
		quoted := make([]string, len(s))
		for i, x := range s {
			quoted[i] = strconv.Quote(x)
		}
		return "[" + strings.Join(quoted, ", ") + "]"
	}
	var b strings.Builder
	b.WriteString("# tandem identities: one user per principal, permissions as in docs/PROTOCOL.md.\nauthorization {\n  users: [\n")
	for _, id := range ids {
		p := Permissions(id.Principal, id.Name)
		// The server keeps a bcrypt hash only: its configuration holds
		// no password.
		hash, err := bcrypt.GenerateFromPassword([]byte(id.Password), bcrypt.DefaultCost)
		if err != nil {
			return "", fmt.Errorf("nats server authorization: %s: %w", id.User, err)
		}
		fmt.Fprintf(&b, "    {user: %s, password: %s, permissions: {\n", strconv.Quote(id.User), strconv.Quote(string(hash)))
		fmt.Fprintf(&b, "      publish: {allow: %s}\n      subscribe: {allow: %s}\n", q(p.Publish.Allow), q(p.Subscribe.Allow))
		if p.Response != nil {
			fmt.Fprintf(&b, "      allow_responses: {max: %d}\n", p.Response.MaxMsgs)
		}
		b.WriteString("    }}\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String(), nil
}

// DefaultCredentialsDir is where this machine's identities live,
// <user config dir>/tandem/nats, such as ~/.config/tandem/nats on Linux.
func DefaultCredentialsDir() (string, error) {
	base, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("credentials: no user config directory (set $HOME or XDG_CONFIG_HOME, or give a directory): %w", err)
	}
	return filepath.Join(base, "tandem", "nats"), nil
}

// IdentityFile is the file of principal p's identity in a credentials
// directory: coordinator.json, worker.json, client.json. More identities
// (AddIdentity) are <principal>-<name>.json.
func IdentityFile(dir string, p Principal) string { return filepath.Join(dir, string(p)+".json") }

// EnsureCredentials returns the identities stored in dir, creating the
// directory (0700) and the three identities of NewIdentities (files 0600)
// on first use, followed by those added with AddIdentity. A file that
// exists is never overwritten; one that does not read or validate is an
// error naming it.
func EnsureCredentials(dir string) ([]Identity, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	fresh := NewIdentities()
	out := make([]Identity, 0, len(fresh))
	for _, id := range fresh {
		path := IdentityFile(dir, id.Principal)
		err := SaveIdentity(path, &id)
		switch {
		case errors.Is(err, os.ErrExist):
			got, err := LoadIdentity(path)
			if err != nil {
				return nil, err
			}
			if got.Principal != id.Principal {
				return nil, fmt.Errorf("credentials: %s holds a %s identity, want %s", path, got.Principal, id.Principal)
			}
			id = *got
		case err != nil:
			return nil, err
		}
		out = append(out, id)
	}
	for _, p := range []Principal{PrincipalWorker, PrincipalClient} {
		extra, err := filepath.Glob(filepath.Join(dir, string(p)+"-*.json"))
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		for _, path := range extra {
			id, err := LoadIdentity(path)
			if err != nil {
				return nil, err
			}
			if id.Principal != p {
				return nil, fmt.Errorf("credentials: %s holds a %s identity, want %s", path, id.Principal, p)
			}
			out = append(out, *id)
		}
	}
	return out, nil
}

// AddIdentity creates a named identity of principal p (a client's own
// namespace, or a worker limited to one worker id) in dir as
// <principal>-<name>.json and returns the file. The NATS server knows it
// from its next start (the embedded server reads dir; a nats-server needs
// its authorization block written again).
func AddIdentity(dir string, p Principal, name string) (string, error) {
	if p != PrincipalClient && p != PrincipalWorker {
		return "", fmt.Errorf("credentials: only client and worker identities are added, not %s", p)
	}
	if err := CheckID(name); err != nil {
		return "", fmt.Errorf("credentials: %s name: %w", p, err)
	}
	if p == PrincipalClient && name == DefaultClient {
		return "", fmt.Errorf("credentials: client %q is the default client, %s", name, IdentityFile(dir, p))
	}
	if _, err := EnsureCredentials(dir); err != nil {
		return "", err
	}
	id := NewIdentity(p, name)
	path := filepath.Join(dir, string(p)+"-"+name+".json")
	if err := SaveIdentity(path, &id); err != nil {
		return "", err
	}
	return path, nil
}

// SaveIdentity writes id to a new file at path with 0600 permissions; it
// fails with an error wrapping os.ErrExist when the file exists.
func SaveIdentity(path string, id *Identity) error {
	if err := id.Validate(); err != nil {
		return fmt.Errorf("credentials: %s: %w", path, err)
	}
	data, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	_, err = f.Write(append(data, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("credentials: write %s: %w", path, err)
	}
	return nil
}

// maxIdentityFile bounds what LoadIdentity reads.
const maxIdentityFile = 64 << 10

// LoadIdentity reads an identity file. It refuses a file that others can
// read or write (on systems with Unix permissions): its password would not
// be secret.
func LoadIdentity(path string) (*Identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	if err := checkPrivate(path, st); err != nil {
		return nil, err
	}
	if st.Size() > maxIdentityFile {
		return nil, fmt.Errorf("credentials: %s is %d bytes, an identity file is at most %d", path, st.Size(), maxIdentityFile)
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("credentials: read %s: %w", path, err)
	}
	var id Identity
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&id); err != nil {
		return nil, fmt.Errorf("credentials: %s: %w", path, err)
	}
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("credentials: %s: %w", path, err)
	}
	return &id, nil
}

// IsLoopback reports whether a listen host reaches only this machine:
// "localhost" or a loopback IP. Empty, 0.0.0.0, :: and names are not.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// checkPrivate refuses an identity file that others may read or write.
// Windows has no such permission bits; its user profile is private.
func checkPrivate(path string, st os.FileInfo) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("credentials: %s has permissions %#o: others may read its password; chmod 600 it", path, perm)
	}
	return nil
}
