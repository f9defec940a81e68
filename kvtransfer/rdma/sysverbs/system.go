//go:build linux || darwin

package sysverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// The system library, bound at run time without cgo: the control verbs by
// symbol, the data-path verbs (inline functions in the header) through the
// context's ops table. The structs are mirrored by hand as byte offsets for
// LP64 (Linux rdma-core and Apple's SDK agree); layout_test.go checks each
// offset and size against the C header where libibverbs-dev is installed.
const (
	// struct ibv_context: the ops table is embedded at 8 (poll_cq is ops+88).
	offCtxPollCQ   = 96
	offCtxPostSend = 208
	offCtxPostRecv = 216

	// struct ibv_port_attr
	sizePortAttr     = 52
	offPortState     = 0
	offPortMaxMTU    = 4
	offPortActiveMTU = 8
	offPortGIDTblLen = 12
	offPortLID       = 34
	offPortLinkLayer = 46

	// struct ibv_qp
	offQPNum = 52
	// struct ibv_mr
	offMRLKey = 36
	offMRRKey = 40

	// struct ibv_qp_init_attr
	sizeQPInitAttr     = 64
	offInitSendCQ      = 8
	offInitRecvCQ      = 16
	offInitMaxSendWR   = 32
	offInitMaxRecvWR   = 36
	offInitMaxSendSGE  = 40
	offInitMaxRecvSGE  = 44
	offInitMaxInline   = 48
	offInitQPType      = 52
	offInitSQSigAll    = 56
	qptUC              = 3
	sizeQPAttr         = 144
	offAttrState       = 0
	offAttrPathMTU     = 8
	offAttrRQPSN       = 20
	offAttrSQPSN       = 24
	offAttrDestQPN     = 28
	offAttrAccessFlags = 32
	offAttrAHDGID      = 56 // ah_attr.grh.dgid
	offAttrAHSGIDIndex = 76 // ah_attr.grh.sgid_index
	offAttrAHHopLimit  = 77
	offAttrAHIsGlobal  = 85
	offAttrAHPortNum   = 86
	offAttrPKeyIndex   = 120
	offAttrPortNum     = 129

	// struct ibv_sge, ibv_send_wr, ibv_recv_wr, ibv_wc
	sizeSGE         = 16
	sizeSendWR      = 128
	offSendWRSG     = 16
	offSendWRNumSGE = 24
	offSendWROpcode = 28
	offSendWRFlags  = 32
	sizeRecvWR      = 32
	offRecvWRSG     = 16
	offRecvWRNumSGE = 24
	sizeWC          = 48
	offWCStatus     = 8
	offWCOpcode     = 12
	offWCByteLen    = 20
	offWCQPNum      = 28

	wrSend       = 2 // IBV_WR_SEND
	sendSignaled = 2 // IBV_SEND_SIGNALED

	qpsInit, qpsRTR, qpsRTS = 1, 2, 3
	maskState               = 1
	maskAccessFlags         = 8
	maskPKeyIndex           = 16
	maskPort                = 32
	maskAV                  = 128
	maskPathMTU             = 256
	maskRQPSN               = 4096
	maskSQPSN               = 65536
	maskDestQPN             = 1048576
)

// DefaultLibrary is the verbs library of this system.
func DefaultLibrary() string {
	if runtime.GOOS == "darwin" {
		return "/usr/lib/librdma.dylib" // Apple's Thunderbolt 5 RDMA, macOS 26.2+
	}
	return "libibverbs.so.1"
}

type syms struct {
	path                                                                  string
	getDeviceList, freeDeviceList, getDeviceName, openDevice, closeDevice uintptr
	queryPort, queryGID, allocPD, deallocPD, createCQ, destroyCQ          uintptr
	createQP, modifyQP, destroyQP, regMR, deregMR                         uintptr
}

// A library stays loaded once opened (dlclose under live contexts would
// unmap their code); loaded remembers each path's symbols or failure.
var (
	loadMu sync.Mutex
	loaded = map[string]*syms{}
)

func load(path string) (*syms, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if s := loaded[path]; s != nil {
		return s, nil
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		if strings.Contains(err.Error(), path) {
			return nil, fmt.Errorf("%w: %v", verbs.ErrNoLibrary, err)
		}
		return nil, fmt.Errorf("%w: %s: %v", verbs.ErrNoLibrary, path, err)
	}
	s := &syms{path: path}
	for _, b := range []struct {
		p    *uintptr
		name string
	}{
		{&s.getDeviceList, "ibv_get_device_list"}, {&s.freeDeviceList, "ibv_free_device_list"},
		{&s.getDeviceName, "ibv_get_device_name"}, {&s.openDevice, "ibv_open_device"},
		{&s.closeDevice, "ibv_close_device"}, {&s.queryPort, "ibv_query_port"}, {&s.queryGID, "ibv_query_gid"},
		{&s.allocPD, "ibv_alloc_pd"}, {&s.deallocPD, "ibv_dealloc_pd"}, {&s.createCQ, "ibv_create_cq"},
		{&s.destroyCQ, "ibv_destroy_cq"}, {&s.createQP, "ibv_create_qp"}, {&s.modifyQP, "ibv_modify_qp"},
		{&s.destroyQP, "ibv_destroy_qp"}, {&s.regMR, "ibv_reg_mr"}, {&s.deregMR, "ibv_dereg_mr"},
	} {
		if *b.p, err = purego.Dlsym(h, b.name); err != nil {
			return nil, fmt.Errorf("%w: %s lacks %s: %v", verbs.ErrNoLibrary, path, b.name, err)
		}
	}
	loaded[path] = s
	return s, nil
}

// System returns the system's verbs library (DefaultLibrary), or an error
// wrapping verbs.ErrNoLibrary when it is not installed.
func System() (verbs.Provider, error) { return Load("") }

// Load returns the verbs library at path ("" for DefaultLibrary), or an
// error wrapping verbs.ErrNoLibrary when it cannot be loaded.
func Load(path string) (verbs.Provider, error) {
	if path == "" {
		path = DefaultLibrary()
	}
	s, err := load(path)
	if err != nil {
		return nil, err
	}
	return &sysProvider{s: s}, nil
}

func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// callErr calls a verb returning 0 or an errno (or -1 with errno set).
func callErr(name string, fn uintptr, args ...uintptr) error {
	r, _, errno := purego.SyscallN(fn, args...)
	if int32(r) == 0 {
		return nil
	}
	if int32(r) > 0 {
		return fmt.Errorf("verbs: %s: errno %d", name, int32(r))
	}
	return fmt.Errorf("verbs: %s: failed (errno %d)", name, errno)
}

// cstr reads a NUL-terminated string from C memory.
func cstr(p uintptr) string {
	if p == 0 {
		return ""
	}
	var b []byte
	for i := uintptr(0); i < 256; i++ {
		c := *(*byte)(unsafe.Add(cptr(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// cptr turns an address of C memory (never Go memory) into a pointer.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func peek32(p uintptr, off int) uint32   { return *(*uint32)(unsafe.Add(cptr(p), off)) }
func peekPtr(p uintptr, off int) uintptr { return *(*uintptr)(unsafe.Add(cptr(p), off)) }

type sysProvider struct{ s *syms }

// deviceList calls f with the device list, freed afterwards.
func (p *sysProvider) deviceList(f func(devs []uintptr)) error {
	var n int32
	list, _, _ := purego.SyscallN(p.s.getDeviceList, uintptr(unsafe.Pointer(&n)))
	if list == 0 {
		return fmt.Errorf("%w: %s: ibv_get_device_list failed (the kernel has no RDMA subsystem, or RDMA is disabled)", verbs.ErrNoDevice, p.s.path)
	}
	defer call(p.s.freeDeviceList, list)
	devs := make([]uintptr, n)
	for i := range devs {
		devs[i] = peekPtr(list, i*8)
	}
	f(devs)
	return nil
}

func (p *sysProvider) Devices() ([]string, error) {
	var names []string
	err := p.deviceList(func(devs []uintptr) {
		for _, d := range devs {
			names = append(names, cstr(call(p.s.getDeviceName, d)))
		}
	})
	return names, err
}

func (p *sysProvider) Open(name string) (verbs.Context, error) {
	var ctx uintptr
	err := p.deviceList(func(devs []uintptr) {
		for _, d := range devs {
			if cstr(call(p.s.getDeviceName, d)) == name {
				ctx = call(p.s.openDevice, d)
				return
			}
		}
	})
	if err != nil {
		return nil, err
	}
	if ctx == 0 {
		return nil, fmt.Errorf("verbs: cannot open device %q", name)
	}
	return &sysContext{s: p.s, name: name, p: ctx}, nil
}

type sysContext struct {
	s    *syms
	name string
	p    uintptr
}

func (c *sysContext) Name() string { return c.name }

func (c *sysContext) QueryPort(port int) (verbs.PortAttr, error) {
	// Room beyond the struct: newer libraries may know more fields.
	var b [256]byte
	if err := callErr("ibv_query_port", c.s.queryPort, c.p, uintptr(port), uintptr(unsafe.Pointer(&b[0]))); err != nil {
		return verbs.PortAttr{}, err
	}
	le := binary.LittleEndian
	return verbs.PortAttr{State: verbs.PortState(le.Uint32(b[offPortState:])), MaxMTU: verbs.MTU(le.Uint32(b[offPortMaxMTU:])),
		ActiveMTU: verbs.MTU(le.Uint32(b[offPortActiveMTU:])), GIDTableLen: int(int32(le.Uint32(b[offPortGIDTblLen:]))),
		LID: le.Uint16(b[offPortLID:]), LinkLayer: int(b[offPortLinkLayer])}, nil
}

func (c *sysContext) QueryGID(port, index int) (verbs.GID, error) {
	var g verbs.GID
	err := callErr("ibv_query_gid", c.s.queryGID, c.p, uintptr(port), uintptr(index), uintptr(unsafe.Pointer(&g[0])))
	return g, err
}

func (c *sysContext) AllocPD() (verbs.PD, error) {
	pd := call(c.s.allocPD, c.p)
	if pd == 0 {
		return nil, errors.New("verbs: ibv_alloc_pd failed (port down or too many init/teardown cycles)")
	}
	return &sysPD{c: c, p: pd}, nil
}

func (c *sysContext) CreateCQ(entries int) (verbs.CQ, error) {
	cq := call(c.s.createCQ, c.p, uintptr(entries), 0, 0, 0)
	if cq == 0 {
		return nil, fmt.Errorf("verbs: ibv_create_cq of %d entries failed", entries)
	}
	return &sysCQ{c: c, p: cq, poll: peekPtr(c.p, offCtxPollCQ), wc: make([]byte, 64*sizeWC)}, nil
}

func (c *sysContext) Close() error { return callErr("ibv_close_device", c.s.closeDevice, c.p) }

type sysPD struct {
	c *sysContext
	p uintptr
}

func (pd *sysPD) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, errors.New("verbs: ibv_reg_mr of an empty buffer")
	}
	mr := call(pd.c.s.regMR, pd.p, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(access))
	if mr == 0 {
		return nil, fmt.Errorf("verbs: ibv_reg_mr of %d bytes failed (Apple allows 100 regions per device)", len(buf))
	}
	return &sysMR{pd: pd, p: mr, buf: buf}, nil
}

func (pd *sysPD) CreateQP(a verbs.QPInit) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*sysCQ)
	rcq, ok2 := a.RecvCQ.(*sysCQ)
	if !ok1 || !ok2 {
		return nil, errors.New("verbs: ibv_create_qp: completion queues of another provider")
	}
	var b [sizeQPInitAttr]byte
	le := binary.LittleEndian
	le.PutUint64(b[offInitSendCQ:], uint64(scq.p))
	le.PutUint64(b[offInitRecvCQ:], uint64(rcq.p))
	le.PutUint32(b[offInitMaxSendWR:], uint32(a.MaxSendWR))
	le.PutUint32(b[offInitMaxRecvWR:], uint32(a.MaxRecvWR))
	le.PutUint32(b[offInitMaxSendSGE:], 1)
	le.PutUint32(b[offInitMaxRecvSGE:], 1)
	le.PutUint32(b[offInitMaxInline:], 0)
	le.PutUint32(b[offInitQPType:], qptUC)
	le.PutUint32(b[offInitSQSigAll:], 0)
	qp := call(pd.c.s.createQP, pd.p, uintptr(unsafe.Pointer(&b[0])))
	if qp == 0 {
		return nil, errors.New("verbs: ibv_create_qp (UC) failed")
	}
	q := &sysQP{pd: pd, p: qp, num: peek32(qp, offQPNum), postSend: peekPtr(pd.c.p, offCtxPostSend),
		postRecv: peekPtr(pd.c.p, offCtxPostRecv)}
	return q, nil
}

func (pd *sysPD) Close() error { return callErr("ibv_dealloc_pd", pd.c.s.deallocPD, pd.p) }

type sysMR struct {
	pd  *sysPD
	p   uintptr
	buf []byte
}

func (m *sysMR) LKey() uint32 { return peek32(m.p, offMRLKey) }
func (m *sysMR) RKey() uint32 { return peek32(m.p, offMRRKey) }
func (m *sysMR) Buf() []byte  { return m.buf }
func (m *sysMR) Close() error { return callErr("ibv_dereg_mr", m.pd.c.s.deregMR, m.p) }

type sysCQ struct {
	c    *sysContext
	p    uintptr
	poll uintptr
	mu   sync.Mutex
	wc   []byte
}

func (cq *sysCQ) Poll(out []verbs.WC) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	n := min(len(out), len(cq.wc)/sizeWC)
	r, _, _ := purego.SyscallN(cq.poll, cq.p, uintptr(n), uintptr(unsafe.Pointer(&cq.wc[0])))
	got := int(int32(r))
	if got < 0 {
		return 0, fmt.Errorf("verbs: ibv_poll_cq failed (%d)", got)
	}
	le := binary.LittleEndian
	for i := 0; i < got; i++ {
		w := cq.wc[i*sizeWC:]
		out[i] = verbs.WC{ID: le.Uint64(w[0:]), Status: verbs.Status(le.Uint32(w[offWCStatus:])), Opcode: verbs.Opcode(le.Uint32(w[offWCOpcode:])),
			ByteLen: le.Uint32(w[offWCByteLen:]), QPNum: le.Uint32(w[offWCQPNum:])}
	}
	return got, nil
}

func (cq *sysCQ) Close() error { return callErr("ibv_destroy_cq", cq.c.s.destroyCQ, cq.p) }

type sysQP struct {
	pd                 *sysPD
	p                  uintptr
	num                uint32
	postSend, postRecv uintptr
	mu                 sync.Mutex
	sendWR             [sizeSendWR]byte
	recvWR             [sizeRecvWR]byte
	sge                [sizeSGE]byte
}

func (q *sysQP) Num() uint32 { return q.num }

func (q *sysQP) modify(name string, attr *[sizeQPAttr]byte, mask uint32) error {
	return callErr("ibv_modify_qp to "+name, q.pd.c.s.modifyQP, q.p, uintptr(unsafe.Pointer(&attr[0])), uintptr(mask))
}

func (q *sysQP) Init(port int) error {
	var a [sizeQPAttr]byte
	le := binary.LittleEndian
	le.PutUint32(a[offAttrState:], qpsInit)
	le.PutUint16(a[offAttrPKeyIndex:], 0)
	a[offAttrPortNum] = byte(port)
	le.PutUint32(a[offAttrAccessFlags:], uint32(verbs.AccessDefault))
	return q.modify("INIT", &a, maskState|maskPKeyIndex|maskPort|maskAccessFlags)
}

func (q *sysQP) ReadyToReceive(r verbs.RTR) error {
	var a [sizeQPAttr]byte
	le := binary.LittleEndian
	le.PutUint32(a[offAttrState:], qpsRTR)
	le.PutUint32(a[offAttrPathMTU:], uint32(r.MTU))
	le.PutUint32(a[offAttrDestQPN:], r.DestQPN)
	le.PutUint32(a[offAttrRQPSN:], r.RemotePSN)
	copy(a[offAttrAHDGID:], r.DGID[:])
	a[offAttrAHSGIDIndex] = byte(r.SGIDIndex)
	a[offAttrAHHopLimit] = 1
	a[offAttrAHIsGlobal] = 1
	a[offAttrAHPortNum] = byte(r.Port)
	return q.modify("RTR", &a, maskState|maskAV|maskPathMTU|maskDestQPN|maskRQPSN)
}

func (q *sysQP) ReadyToSend(psn uint32) error {
	var a [sizeQPAttr]byte
	le := binary.LittleEndian
	le.PutUint32(a[offAttrState:], qpsRTS)
	le.PutUint32(a[offAttrSQPSN:], psn)
	return q.modify("RTS", &a, maskState|maskSQPSN)
}

func (q *sysQP) sgeFor(mr verbs.MR, buf []byte) error {
	m, ok := mr.(*sysMR)
	if !ok || len(buf) == 0 {
		return errors.New("verbs: post: buffer not in a region of this provider")
	}
	lo := uintptr(unsafe.Pointer(&m.buf[0]))
	p := uintptr(unsafe.Pointer(&buf[0]))
	if p < lo || p+uintptr(len(buf)) > lo+uintptr(len(m.buf)) {
		return errors.New("verbs: post: buffer outside its memory region")
	}
	le := binary.LittleEndian
	le.PutUint64(q.sge[0:], uint64(p))
	le.PutUint32(q.sge[8:], uint32(len(buf)))
	le.PutUint32(q.sge[12:], m.LKey())
	return nil
}

// PostSend and PostRecv call the ops table as the header's inline
// ibv_post_send and ibv_post_recv do.
func (q *sysQP) PostSend(id uint64, mr verbs.MR, buf []byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.sgeFor(mr, buf); err != nil {
		return err
	}
	w := q.sendWR[:]
	clear(w)
	le := binary.LittleEndian
	le.PutUint64(w[0:], id)
	le.PutUint64(w[offSendWRSG:], uint64(uintptr(unsafe.Pointer(&q.sge[0]))))
	le.PutUint32(w[offSendWRNumSGE:], 1)
	le.PutUint32(w[offSendWROpcode:], wrSend)
	le.PutUint32(w[offSendWRFlags:], sendSignaled)
	var bad uintptr
	return callErr("ibv_post_send", q.postSend, q.p, uintptr(unsafe.Pointer(&q.sendWR[0])), uintptr(unsafe.Pointer(&bad)))
}

func (q *sysQP) PostRecv(id uint64, mr verbs.MR, buf []byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.sgeFor(mr, buf); err != nil {
		return err
	}
	w := q.recvWR[:]
	clear(w)
	le := binary.LittleEndian
	le.PutUint64(w[0:], id)
	le.PutUint64(w[offRecvWRSG:], uint64(uintptr(unsafe.Pointer(&q.sge[0]))))
	le.PutUint32(w[offRecvWRNumSGE:], 1)
	var bad uintptr
	return callErr("ibv_post_recv", q.postRecv, q.p, uintptr(unsafe.Pointer(&q.recvWR[0])), uintptr(unsafe.Pointer(&bad)))
}

func (q *sysQP) Close() error { return callErr("ibv_destroy_qp", q.pd.c.s.destroyQP, q.p) }
