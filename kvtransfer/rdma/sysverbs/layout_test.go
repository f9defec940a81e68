//go:build linux

package sysverbs

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// layoutProgram prints, for each mirrored field, its offset in the C
// header; the names match the table in TestLayoutMatchesHeader.
const layoutProgram = `#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define OFF(name, type, field) printf("%s %zu\n", name, offsetof(type, field))
#define SIZE(name, type) printf("%s %zu\n", name, sizeof(type))
int main(void) {
	printf("ctx.poll_cq %zu\n", offsetof(struct ibv_context, ops) + offsetof(struct ibv_context_ops, poll_cq));
	printf("ctx.post_send %zu\n", offsetof(struct ibv_context, ops) + offsetof(struct ibv_context_ops, post_send));
	printf("ctx.post_recv %zu\n", offsetof(struct ibv_context, ops) + offsetof(struct ibv_context_ops, post_recv));
	SIZE("port_attr", struct ibv_port_attr);
	OFF("port.state", struct ibv_port_attr, state);
	OFF("port.max_mtu", struct ibv_port_attr, max_mtu);
	OFF("port.active_mtu", struct ibv_port_attr, active_mtu);
	OFF("port.gid_tbl_len", struct ibv_port_attr, gid_tbl_len);
	OFF("port.lid", struct ibv_port_attr, lid);
	OFF("port.link_layer", struct ibv_port_attr, link_layer);
	OFF("qp.qp_num", struct ibv_qp, qp_num);
	OFF("mr.lkey", struct ibv_mr, lkey);
	OFF("mr.rkey", struct ibv_mr, rkey);
	SIZE("qp_init_attr", struct ibv_qp_init_attr);
	OFF("init.send_cq", struct ibv_qp_init_attr, send_cq);
	OFF("init.recv_cq", struct ibv_qp_init_attr, recv_cq);
	OFF("init.max_send_wr", struct ibv_qp_init_attr, cap.max_send_wr);
	OFF("init.max_recv_wr", struct ibv_qp_init_attr, cap.max_recv_wr);
	OFF("init.max_send_sge", struct ibv_qp_init_attr, cap.max_send_sge);
	OFF("init.max_recv_sge", struct ibv_qp_init_attr, cap.max_recv_sge);
	OFF("init.max_inline_data", struct ibv_qp_init_attr, cap.max_inline_data);
	OFF("init.qp_type", struct ibv_qp_init_attr, qp_type);
	OFF("init.sq_sig_all", struct ibv_qp_init_attr, sq_sig_all);
	printf("qpt.uc %d\n", IBV_QPT_UC);
	SIZE("qp_attr", struct ibv_qp_attr);
	OFF("attr.qp_state", struct ibv_qp_attr, qp_state);
	OFF("attr.path_mtu", struct ibv_qp_attr, path_mtu);
	OFF("attr.rq_psn", struct ibv_qp_attr, rq_psn);
	OFF("attr.sq_psn", struct ibv_qp_attr, sq_psn);
	OFF("attr.dest_qp_num", struct ibv_qp_attr, dest_qp_num);
	OFF("attr.qp_access_flags", struct ibv_qp_attr, qp_access_flags);
	OFF("attr.ah.dgid", struct ibv_qp_attr, ah_attr.grh.dgid);
	OFF("attr.ah.sgid_index", struct ibv_qp_attr, ah_attr.grh.sgid_index);
	OFF("attr.ah.hop_limit", struct ibv_qp_attr, ah_attr.grh.hop_limit);
	OFF("attr.ah.is_global", struct ibv_qp_attr, ah_attr.is_global);
	OFF("attr.ah.port_num", struct ibv_qp_attr, ah_attr.port_num);
	OFF("attr.pkey_index", struct ibv_qp_attr, pkey_index);
	OFF("attr.port_num", struct ibv_qp_attr, port_num);
	SIZE("sge", struct ibv_sge);
	SIZE("send_wr", struct ibv_send_wr);
	OFF("send_wr.sg_list", struct ibv_send_wr, sg_list);
	OFF("send_wr.num_sge", struct ibv_send_wr, num_sge);
	OFF("send_wr.opcode", struct ibv_send_wr, opcode);
	OFF("send_wr.send_flags", struct ibv_send_wr, send_flags);
	SIZE("recv_wr", struct ibv_recv_wr);
	OFF("recv_wr.sg_list", struct ibv_recv_wr, sg_list);
	OFF("recv_wr.num_sge", struct ibv_recv_wr, num_sge);
	SIZE("wc", struct ibv_wc);
	OFF("wc.status", struct ibv_wc, status);
	OFF("wc.opcode", struct ibv_wc, opcode);
	OFF("wc.byte_len", struct ibv_wc, byte_len);
	OFF("wc.qp_num", struct ibv_wc, qp_num);
	printf("wr.send %d\n", IBV_WR_SEND);
	printf("send.signaled %d\n", IBV_SEND_SIGNALED);
	printf("qps.init %d\nqps.rtr %d\nqps.rts %d\n", IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS);
	printf("mask.state %d\nmask.access %d\nmask.pkey %d\nmask.port %d\nmask.av %d\nmask.mtu %d\nmask.rq_psn %d\nmask.sq_psn %d\nmask.dest_qpn %d\n",
		IBV_QP_STATE, IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_RQ_PSN, IBV_QP_SQ_PSN, IBV_QP_DEST_QPN);
	printf("access.local_write %d\naccess.remote_write %d\naccess.remote_read %d\n", IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ);
	printf("port.active %d\nwc.success %d\nwc.loc_len_err %d\nwc.flush_err %d\nwc.recv %d\n", IBV_PORT_ACTIVE, IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
	return 0;
}
`

// TestLayoutMatchesHeader compiles a C program against the installed
// <infiniband/verbs.h> (libibverbs-dev; scripts/setup.sh installs it) and
// checks every struct offset, size and constant the binding mirrors. gcc is
// used only here, at test time; the binding itself is pure Go.
func TestLayoutMatchesHeader(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed")
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("libibverbs-dev not installed (scripts/setup.sh installs it)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	if err := os.WriteFile(src, []byte(layoutProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	c := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		n, err := strconv.Atoi(f[1])
		if len(f) != 2 || err != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		c[f[0]] = n
	}
	want := map[string]int{
		"ctx.poll_cq": offCtxPollCQ, "ctx.post_send": offCtxPostSend, "ctx.post_recv": offCtxPostRecv,
		"port.state": offPortState, "port.max_mtu": offPortMaxMTU, "port.active_mtu": offPortActiveMTU,
		"port.gid_tbl_len": offPortGIDTblLen, "port.lid": offPortLID, "port.link_layer": offPortLinkLayer,
		"qp.qp_num": offQPNum, "mr.lkey": offMRLKey, "mr.rkey": offMRRKey,
		"qp_init_attr": sizeQPInitAttr, "init.send_cq": offInitSendCQ, "init.recv_cq": offInitRecvCQ,
		"init.max_send_wr": offInitMaxSendWR, "init.max_recv_wr": offInitMaxRecvWR, "init.max_send_sge": offInitMaxSendSGE,
		"init.max_recv_sge": offInitMaxRecvSGE, "init.max_inline_data": offInitMaxInline, "init.qp_type": offInitQPType,
		"init.sq_sig_all": offInitSQSigAll, "qpt.uc": qptUC,
		"qp_attr": sizeQPAttr, "attr.qp_state": offAttrState, "attr.path_mtu": offAttrPathMTU, "attr.rq_psn": offAttrRQPSN,
		"attr.sq_psn": offAttrSQPSN, "attr.dest_qp_num": offAttrDestQPN, "attr.qp_access_flags": offAttrAccessFlags,
		"attr.ah.dgid": offAttrAHDGID, "attr.ah.sgid_index": offAttrAHSGIDIndex, "attr.ah.hop_limit": offAttrAHHopLimit,
		"attr.ah.is_global": offAttrAHIsGlobal, "attr.ah.port_num": offAttrAHPortNum, "attr.pkey_index": offAttrPKeyIndex,
		"attr.port_num": offAttrPortNum,
		"sge":           sizeSGE, "send_wr": sizeSendWR, "send_wr.sg_list": offSendWRSG, "send_wr.num_sge": offSendWRNumSGE,
		"send_wr.opcode": offSendWROpcode, "send_wr.send_flags": offSendWRFlags,
		"recv_wr": sizeRecvWR, "recv_wr.sg_list": offRecvWRSG, "recv_wr.num_sge": offRecvWRNumSGE,
		"wc": sizeWC, "wc.status": offWCStatus, "wc.opcode": offWCOpcode, "wc.byte_len": offWCByteLen, "wc.qp_num": offWCQPNum,
		"wr.send": wrSend, "send.signaled": sendSignaled, "qps.init": qpsInit, "qps.rtr": qpsRTR, "qps.rts": qpsRTS,
		"mask.state": maskState, "mask.access": maskAccessFlags, "mask.pkey": maskPKeyIndex, "mask.port": maskPort,
		"mask.av": maskAV, "mask.mtu": maskPathMTU, "mask.rq_psn": maskRQPSN, "mask.sq_psn": maskSQPSN, "mask.dest_qpn": maskDestQPN,
		"access.local_write": int(verbs.AccessLocalWrite), "access.remote_write": int(verbs.AccessRemoteWrite),
		"access.remote_read": int(verbs.AccessRemoteRead), "port.active": int(verbs.PortActive), "wc.success": int(verbs.StatusSuccess),
		"wc.loc_len_err": int(verbs.StatusLocLenErr), "wc.flush_err": int(verbs.StatusFlushErr), "wc.recv": int(verbs.OpRecv),
	}
	for name, w := range want {
		got, ok := c[name]
		if !ok {
			t.Errorf("%s: not printed by the C program", name)
			continue
		}
		if got != w {
			t.Errorf("%s: the header says %d, the binding uses %d", name, got, w)
		}
	}
	// The port attributes may only grow: QueryPort passes a larger buffer.
	if c["port_attr"] < sizePortAttr || c["port_attr"] > 256 {
		t.Errorf("struct ibv_port_attr is %d bytes; the binding assumes %d..256", c["port_attr"], sizePortAttr)
	}
	if !t.Failed() {
		t.Logf("%d offsets, sizes and constants match the header", len(want))
	}
}

// TestSystemWithoutDevices: where the library is installed but the kernel
// has no RDMA (this machine, CI), System loads and lists no device, with an
// error that says so (verbs.ErrNoDevice), never a crash.
func TestSystemWithoutDevices(t *testing.T) {
	p, err := System()
	if err != nil {
		if !errors.Is(err, verbs.ErrNoLibrary) {
			t.Fatalf("System: %v, want verbs.ErrNoLibrary", err)
		}
		t.Skipf("no verbs library: %v", err)
	}
	names, err := p.Devices()
	t.Logf("devices %v, err %v", names, err)
	if err != nil && !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("Devices: %v, want verbs.ErrNoDevice", err)
	}
	if err == nil && len(names) > 0 {
		ctx, err := p.Open(names[0])
		if err != nil {
			t.Fatal(err)
		}
		pa, err := ctx.QueryPort(1)
		t.Logf("%s port 1: %+v, %v", names[0], pa, err)
		ctx.Close()
	}
}

// TestLoadMissingLibrary: a library that is not there, or that lacks the
// verbs, is verbs.ErrNoLibrary with the path in the message.
func TestLoadMissingLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	_, err := Load(missing)
	if !errors.Is(err, verbs.ErrNoLibrary) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Load(%s): %v", missing, err)
	}
	// libc is a library, but not a verbs library.
	if _, err := Load("libc.so.6"); !errors.Is(err, verbs.ErrNoLibrary) || !strings.Contains(err.Error(), "ibv_get_device_list") {
		t.Fatalf("Load(libc.so.6): %v", err)
	}
}
