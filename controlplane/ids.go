package controlplane

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
)

// MaxIDLen is the longest job, worker, group or session id accepted.
const MaxIDLen = 64

// SecretSize is the size in bytes of a transfer session secret.
const SecretSize = 32

// lowercase, unpadded base32: ids stay short, case-insensitive and safe in
// subjects, file names and KV keys.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// CheckID reports whether id can be used as a job, worker, group or session
// id: 1 to MaxIDLen characters from [A-Za-z0-9_-]. Such an id is one subject
// token and a valid KV key, so it can never widen a subscription.
func CheckID(id string) error {
	if id == "" {
		return fmt.Errorf("empty id")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("id %.16q... is %d bytes long, at most %d allowed", id, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			continue
		}
		return fmt.Errorf("id %q has %q at byte %d: only letters, digits, '_' and '-' are allowed", id, c, i)
	}
	return nil
}

// NewJobID returns a fresh random job id ("j-" and 20 base32 characters,
// 100 random bits).
func NewJobID() string { return "j-" + randomToken(13)[:20] }

// JobIDForKey returns the job id of client's submission with idempotency
// key key. The id is derived from the client and the key, so a duplicate
// submission is answered with the id of the first one without a lookup,
// and two clients' keys never meet.
func JobIDForKey(client, key string) string {
	sum := sha256.Sum256([]byte(client + "\x00" + key))
	return "k-" + idEncoding.EncodeToString(sum[:])[:20]
}

// JobIDFor returns the job id client's submission gets: derived from its
// idempotency key when it has one (so duplicates share it), fresh otherwise.
func JobIDFor(client string, req *SubmitRequest) string {
	if req.IdempotencyKey != "" {
		return JobIDForKey(client, req.IdempotencyKey)
	}
	return NewJobID()
}

// NewSessionID returns a fresh random transfer session id.
func NewSessionID() string { return "s-" + randomToken(13)[:20] }

// NewSecret returns a fresh transfer session secret of SecretSize random
// bytes, generated per job and sent only to the two sides of the transfer.
func NewSecret() []byte {
	b := make([]byte, SecretSize)
	// crypto/rand.Read never returns an error (it crashes the program if the
	// system's random source fails), so there is nothing to handle.
	_, _ = rand.Read(b)
	return b
}

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(idEncoding.EncodeToString(b))
}
