package kvtransfer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
)

// nonceSize is the size of the server's and the client's fresh nonces.
const nonceSize = 32

// newNonce returns fresh random bytes. Each connection gets its own server
// nonce, so a proof recorded on one connection is worthless on another:
// that is what refuses replays.
func newNonce() []byte {
	b := make([]byte, nonceSize)
	rand.Read(b) // never fails (crypto/rand aborts the process instead)
	return b
}

// Proof roles: the client proves it knows the secret for the server's nonce;
// the server answers with a proof for the client's nonce under another label,
// so that neither proof can be reflected back as the other.
const (
	roleClient = "client"
	roleServer = "server"
)

// proof is HMAC-SHA256(secret, label || role || kind || len(session) ||
// session || server nonce || client nonce).
func proof(secret []byte, role string, kind connKind, session string, snonce, cnonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("tandem/kvtransfer/1\x00" + role + "\x00"))
	var b [5]byte
	b[0] = byte(kind)
	binary.LittleEndian.PutUint32(b[1:], uint32(len(session)))
	m.Write(b[:])
	m.Write([]byte(session))
	m.Write(snonce)
	m.Write(cnonce)
	return m.Sum(nil)
}

// proofOK compares in constant time.
func proofOK(secret []byte, role string, kind connKind, session string, snonce, cnonce, got []byte) bool {
	return hmac.Equal(proof(secret, role, kind, session, snonce, cnonce), got)
}
