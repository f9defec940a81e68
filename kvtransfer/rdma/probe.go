package rdma

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/internal/crc32c"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// DeviceInfo is what Inspect reports of one device.
type DeviceInfo struct {
	Name  string     `json:"name"`
	Ports []PortInfo `json:"ports,omitempty"`
	Err   string     `json:"error,omitempty"`
}

// PortInfo is one port of a device.
type PortInfo struct {
	Port      int       `json:"port"`
	State     string    `json:"state"`
	ActiveMTU int       `json:"active_mtu"`
	MaxMTU    int       `json:"max_mtu"`
	LinkLayer string    `json:"link_layer"`
	GIDs      []GIDInfo `json:"gids,omitempty"`
}

// GIDInfo is a set entry of a port's GID table.
type GIDInfo struct {
	Index int    `json:"index"`
	GID   string `json:"gid"`
}

// Usable reports whether a link could use the port: ACTIVE with a GID.
func (p PortInfo) Usable() bool { return p.State == verbs.PortActive.String() && len(p.GIDs) > 0 }

// Inspect lists p's devices with their ports and GIDs. It fails, wrapping
// verbs.ErrNoDevice, when there is no device at all.
func Inspect(p verbs.Provider) ([]DeviceInfo, error) {
	names, err := p.Devices()
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: the library lists none", verbs.ErrNoDevice)
	}
	var out []DeviceInfo
	for _, name := range names {
		d := DeviceInfo{Name: name}
		ctx, err := p.Open(name)
		if err != nil {
			d.Err = err.Error()
			out = append(out, d)
			continue
		}
		for port := 1; port <= 2; port++ {
			pa, err := ctx.QueryPort(port)
			if err != nil {
				if port == 1 {
					d.Err = err.Error()
				}
				break
			}
			pi := PortInfo{Port: port, State: pa.State.String(), ActiveMTU: pa.ActiveMTU.Bytes(), MaxMTU: pa.MaxMTU.Bytes(),
				LinkLayer: map[int]string{1: "InfiniBand", 2: "Ethernet"}[pa.LinkLayer]}
			for i := 0; i < min(pa.GIDTableLen, 16); i++ {
				if g, err := ctx.QueryGID(port, i); err == nil && !g.IsZero() {
					pi.GIDs = append(pi.GIDs, GIDInfo{Index: i, GID: g.String()})
				}
			}
			d.Ports = append(d.Ports, pi)
		}
		ctx.Close()
		out = append(out, d)
	}
	return out, nil
}

// The probe protocol runs over one stream. The prober sends frames whose
// header is "ping", "data <index> <crc32c>" or "done"; the responder
// echoes a ping, checks each data frame (its index in sequence, the
// checksum of its payload) and answers done with "ok <frames> <bad>".

// LinkReport is what ProbeLink measured over a link.
type LinkReport struct {
	Peer     string `json:"peer"`
	SlotSize int    `json:"slot_size"`
	Slots    int    `json:"slots"`
	// Round trips of empty frames, in microseconds.
	Pings    int     `json:"pings"`
	RTTP50us float64 `json:"rtt_p50_us"`
	RTTP99us float64 `json:"rtt_p99_us"`
	// Checked frames: the bytes, how long until the responder confirmed
	// them, and how many it found out of order or damaged.
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	GBps      float64 `json:"gbytes_per_s"`
	Frames    int64   `json:"frames"`
	BadFrames int64   `json:"bad_frames"`
	// Link is the link's reliability work during the probe (slots resent,
	// dropped for damage or order): the wire's loss as the link saw it.
	Link LinkStats `json:"link"`
}

// ServeProbes answers probes on every stream l accepts until l closes.
func ServeProbes(l *Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			serveProbe(c)
		}()
	}
}

func serveProbe(c *Conn) {
	buf := []byte(nil)
	var frames, bad int64
	for {
		var hdr string
		err := c.ReadFrame(func(h []byte, n int) ([]byte, error) {
			hdr = string(h)
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			buf = buf[:n]
			return buf, nil
		})
		if err != nil {
			return
		}
		f := strings.Fields(hdr)
		switch {
		case len(f) == 1 && f[0] == "ping":
			err = c.WriteFrame([]byte("pong"), nil)
		case len(f) == 3 && f[0] == "data":
			idx, e1 := strconv.ParseInt(f[1], 10, 64)
			sum, e2 := strconv.ParseUint(f[2], 10, 32)
			if e1 != nil || e2 != nil || idx != frames || crc32c.Checksum(buf) != uint32(sum) {
				bad++
			}
			frames++
		case len(f) == 1 && f[0] == "done":
			err = c.WriteFrame([]byte(fmt.Sprintf("ok %d %d", frames, bad)), nil)
			frames, bad = 0, 0
		default:
			return
		}
		if err != nil {
			return
		}
	}
}

// ProbeLink measures the link to the responder at addr: pings round trips
// of empty frames, then n bytes of checked frames of frame bytes each.
func ProbeLink(ctx context.Context, t *Transport, addr string, pings int, n int64, frame int) (LinkReport, error) {
	r := LinkReport{Peer: addr, SlotSize: t.cfg.SlotSize, Slots: t.cfg.Slots, Pings: pings}
	if frame <= 0 || frame > t.cfg.MaxPayload {
		return r, fmt.Errorf("rdma: probe: frame of %d bytes (limit %d)", frame, t.cfg.MaxPayload)
	}
	before := t.Stats()
	c, err := t.Dial(ctx, addr)
	if err != nil {
		return r, fmt.Errorf("rdma: probe: peer %s unreachable: %w", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
		c.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()); c.SetWriteDeadline(time.Now()) })
	defer stop()
	read := func() (string, error) {
		var hdr string
		err := c.ReadFrame(func(h []byte, n int) ([]byte, error) {
			hdr = string(h)
			if n != 0 {
				return nil, fmt.Errorf("rdma: probe: answer with a %d-byte payload", n)
			}
			return nil, nil
		})
		return hdr, err
	}
	rtts := make([]time.Duration, 0, pings)
	for i := 0; i < pings; i++ {
		start := time.Now()
		if err := c.WriteFrame([]byte("ping"), nil); err != nil {
			return r, fmt.Errorf("rdma: probe %s: ping: %w", addr, err)
		}
		if h, err := read(); err != nil || h != "pong" {
			return r, fmt.Errorf("rdma: probe %s: pong: %q, %v", addr, h, err)
		}
		rtts = append(rtts, time.Since(start))
	}
	if len(rtts) > 0 {
		slices.Sort(rtts)
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		r.RTTP50us, r.RTTP99us = us(rtts[len(rtts)/2]), us(rtts[len(rtts)*99/100])
	}
	// A few distinct payloads, so that a slot delivered twice or out of
	// place is caught by the checksum as well as by the index.
	var pay [4][]byte
	var sums [4]uint32
	rng := rand.NewChaCha8([32]byte{'p', 'r', 'o', 'b', 'e'})
	for i := range pay {
		pay[i] = make([]byte, frame)
		rng.Read(pay[i])
		binary.LittleEndian.PutUint32(pay[i], uint32(i))
		sums[i] = crc32c.Checksum(pay[i])
	}
	start := time.Now()
	var sent int64
	for idx := int64(0); sent < n; idx++ {
		p := pay[idx%4][:min(int64(frame), n-sent)]
		sum := sums[idx%4]
		if len(p) < frame {
			sum = crc32c.Checksum(p)
		}
		if err := c.WriteFrame([]byte(fmt.Sprintf("data %d %d", idx, sum)), p); err != nil {
			return r, fmt.Errorf("rdma: probe %s: data frame %d: %w", addr, idx, err)
		}
		sent += int64(len(p))
		r.Frames++
	}
	if err := c.WriteFrame([]byte("done"), nil); err != nil {
		return r, fmt.Errorf("rdma: probe %s: done: %w", addr, err)
	}
	h, err := read()
	if err != nil {
		return r, fmt.Errorf("rdma: probe %s: summary: %w", addr, err)
	}
	var got int64
	if _, err := fmt.Sscanf(h, "ok %d %d", &got, &r.BadFrames); err != nil {
		return r, fmt.Errorf("rdma: probe %s: summary %q", addr, h)
	}
	el := time.Since(start)
	r.Bytes, r.Seconds = sent, el.Seconds()
	if el > 0 {
		r.GBps = float64(sent) / el.Seconds() / 1e9
	}
	r.BadFrames += r.Frames - got // frames the responder never saw
	r.Link = t.Stats()
	r.Link.sub(before)
	if r.BadFrames != 0 {
		return r, fmt.Errorf("rdma: probe %s: %w: %d of %d checked frames bad", addr, errFrame, r.BadFrames, r.Frames)
	}
	return r, nil
}

func (s *LinkStats) sub(o LinkStats) {
	s.SlotsSent -= o.SlotsSent
	s.SlotsReceived -= o.SlotsReceived
	s.Retransmits -= o.Retransmits
	s.Timeouts -= o.Timeouts
	s.FastRetransmits -= o.FastRetransmits
	s.Corrupt -= o.Corrupt
	s.OutOfOrder -= o.OutOfOrder
	s.Duplicates -= o.Duplicates
	s.LenErrors -= o.LenErrors
	s.AcksSent -= o.AcksSent
}
