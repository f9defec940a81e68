package kvtransfer

import "time"

// Timeouts bound every wait on a connection. Zero fields take the defaults.
type Timeouts struct {
	// Handshake bounds dialing and the CHALLENGE/HELLO/WELCOME exchange.
	// Default 5 s.
	Handshake time.Duration
	// IO bounds writing one frame. Default 15 s.
	IO time.Duration
	// Idle is how long a connection may stay silent before it is taken for
	// dead: the receiver's wait for the next frame and the sender's wait for
	// an ACK or PONG. Default 15 s.
	Idle time.Duration
	// KeepAlive is how often a sender with nothing to send pings, so that an
	// idle link during a long prefill is not taken for dead. It must be well
	// under Idle. Default 2 s.
	KeepAlive time.Duration
}

func (t Timeouts) withDefaults() Timeouts {
	if t.Handshake <= 0 {
		t.Handshake = 5 * time.Second
	}
	if t.IO <= 0 {
		t.IO = 15 * time.Second
	}
	if t.Idle <= 0 {
		t.Idle = 15 * time.Second
	}
	if t.KeepAlive <= 0 {
		t.KeepAlive = 2 * time.Second
	}
	if t.KeepAlive > t.Idle/2 {
		t.KeepAlive = t.Idle / 2
	}
	return t
}
