package kvtransfer

import (
	"context"
	"fmt"
	"time"
)

// clientHandshake runs the client side of the handshake on a fresh
// connection: read the server's CHALLENGE, prove the secret for its nonce in
// a HELLO, and check the server's proof in the WELCOME, which it returns.
func clientHandshake(ctx context.Context, c Conn, kind connKind, session string, secret []byte, timeout time.Duration) (*header, error) {
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	c.SetReadDeadline(dl)
	c.SetWriteDeadline(dl)
	stop := context.AfterFunc(ctx, func() { interrupt(c) })
	defer stop()
	w, err := handshakeFrames(c, kind, session, secret)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return w, err
}

// interrupt makes pending and future calls on c fail at once.
func interrupt(c Conn) {
	past := time.Unix(1, 0)
	c.SetReadDeadline(past)
	c.SetWriteDeadline(past)
}

func handshakeFrames(c Conn, kind connKind, session string, secret []byte) (*header, error) {
	var ch header
	if err := readControl(c, &ch); err != nil {
		return nil, err
	}
	if ch.Type != frameChallenge || ch.Version != ProtocolVersion || len(ch.Nonce) != nonceSize {
		return nil, fmt.Errorf("%w: expected a version %d CHALLENGE with a %d-byte nonce, got %s version %d with %d bytes",
			ErrProtocol, ProtocolVersion, nonceSize, ch.Type, ch.Version, len(ch.Nonce))
	}
	cnonce := newNonce()
	b, err := encodeHeader(&header{Type: frameHello, Version: ProtocolVersion, Kind: kind, Session: session,
		Nonce: cnonce, Proof: proof(secret, roleClient, kind, session, ch.Nonce, cnonce)})
	if err != nil {
		return nil, err
	}
	if err := c.WriteFrame(b, nil); err != nil {
		return nil, err
	}
	w := new(header)
	if err := readControl(c, w); err != nil {
		return nil, err
	}
	if w.Type != frameWelcome {
		return nil, fmt.Errorf("%w: expected WELCOME, got %s", ErrProtocol, w.Type)
	}
	if !proofOK(secret, roleServer, kind, session, ch.Nonce, cnonce, w.Proof) {
		return nil, fmt.Errorf("%w: the server at %s could not prove the session secret", ErrAuth, c.RemoteAddr())
	}
	return w, nil
}

// readControl reads a frame without payload; an ERROR frame becomes the
// peer's refusal.
func readControl(c Conn, h *header) error {
	err := c.ReadFrame(func(hb []byte, n int) ([]byte, error) {
		if n != 0 {
			return nil, fmt.Errorf("%w: control frame with a %d-byte payload", ErrProtocol, n)
		}
		return nil, decodeHeader(hb, h)
	})
	if err != nil {
		return err
	}
	if h.Type == frameError {
		return &remoteError{code: h.Code, msg: h.Msg}
	}
	return nil
}
