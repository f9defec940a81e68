package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/sysverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

const probeUsage = `usage: decode-worker rdma-probe [flags]

Reports this machine's RDMA environment (OS build, RDMA enabled, Thunderbolt
Bridge, devices, ports, MTUs, GIDs). With --listen it then answers probes;
with --peer it measures the link to a peer running --listen: round trips,
then bandwidth with checked frames, at each slot size (the listener and the
prober must give the same --slot-sizes and --slots; slot size i uses the
address's port + i).

With --group-config FILE --rank R (the worker's own file and rank, checked
as the worker checks them) it also lists the links rank R uses: the
pipeline ring's (ranks R-1 and R+1, the last rank closing the ring to rank
0) and, with tensor > 1, its stage's collective links (each other rank of
the stage up to 4 ranks, the stage's ring neighbours above), with the
--listen and --peer commands that measure each alone. A rank answers
probes on its endpoint's port + 1, where its worker takes RDMA link
bootstraps (stop the worker first): --answer answers there until
interrupted; --measure probes each of rank R's links in turn, every rank
answering, and reports for each a round trip (p50, us) and rate (GB/s) in
a hardware profile's terms (configs/hardware: link rtt_us, gb_per_s), and
the worst of them, the figure one profile for the whole group must take.
Measure one rank at a time, so that no two measurements share a link.

`

// probeProcess names rdma-probe's environment variables:
// TANDEM_DECODE_WORKER_RDMA_PROBE_<FLAG>.
const probeProcess = "decode-worker-rdma-probe"

// probeOptions are rdma-probe's flags.
type probeOptions struct {
	library, device string
	listen, peer    string
	slotSizes       []int
	slots           int
	bytes           int64
	frame           int
	pings           int
	timeout         time.Duration
	json            bool
	// Layout mode: the group file and rank, an optional model to check the
	// layout against, and what to do with the rank's links.
	groupConfig, model string
	rank               int
	answer, measure    bool
	slotSizesArg       string
}

func parseProbe(args []string, out io.Writer) (*probeOptions, error) {
	fs := pflag.NewFlagSet("rdma-probe", pflag.ContinueOnError)
	o := &probeOptions{}
	fs.StringVar(&o.library, "library", "", "the verbs library (default "+sysverbs.DefaultLibrary()+")")
	fs.StringVar(&o.device, "device", "", "the device to use (default: the one with the bootstrap address as a GID)")
	fs.StringVar(&o.listen, "listen", "", "answer probes on this address (host:port) until interrupted")
	fs.StringVar(&o.peer, "peer", "", "probe the link to a peer listening on this address (host:port)")
	sizes := fs.String("slot-sizes", "32KiB,128KiB,512KiB", "slot sizes to measure, comma-separated")
	fs.IntVar(&o.slots, "slots", rdma.DefaultSlots, "slots per ring")
	bytes := fs.String("bytes", "256MiB", "bytes of checked frames per slot size")
	frameS := fs.String("frame", "1MiB", "bytes per checked frame")
	fs.IntVar(&o.pings, "pings", 1000, "round trips timed per slot size")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on each slot size's probe")
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	fs.StringVar(&o.groupConfig, "group-config", "", "the decode group's file: list (and with --answer or --measure, probe) rank --rank's links")
	fs.IntVar(&o.rank, "rank", 0, "with --group-config: the rank whose links to list")
	fs.StringVar(&o.model, "model", "", "with --group-config: checkpoint directory to check the layout against (its layers, tensor dividing its heads)")
	fs.BoolVar(&o.answer, "answer", false, "with --group-config: answer probes on rank --rank's probe address (its endpoint's port + 1) until interrupted")
	fs.BoolVar(&o.measure, "measure", false, "with --group-config: probe each of rank --rank's links in turn (every rank running --answer)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), probeUsage)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nA flag not given is read from %s (%s for --peer).\n\n%s\n",
			config.EnvName(probeProcess, "<FLAG>"), config.EnvName(probeProcess, "peer"), config.BytesHelp())
	}
	if err := config.ParseArgs(fs, probeProcess, args, out, os.Stderr); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("rdma-probe: unexpected argument %q", fs.Arg(0))
	}
	if err := o.checkModes(); err != nil {
		return nil, err
	}
	o.slotSizesArg = *sizes
	for _, s := range strings.Split(*sizes, ",") {
		n, err := config.ParseBytes(s)
		if err != nil || n <= 0 || n > 1<<30 {
			return nil, fmt.Errorf("rdma-probe: --slot-sizes: %q is not a slot size", s)
		}
		o.slotSizes = append(o.slotSizes, int(n))
	}
	var err error
	if o.bytes, err = config.ParseBytes(*bytes); err != nil || o.bytes <= 0 {
		return nil, fmt.Errorf("rdma-probe: --bytes %q: want a positive byte size", *bytes)
	}
	f, err := config.ParseBytes(*frameS)
	if err != nil || f <= 0 || f > 16<<20 {
		return nil, fmt.Errorf("rdma-probe: --frame %q: want 1B..16MiB", *frameS)
	}
	o.frame = int(f)
	if o.pings < 0 || o.slots < 4 {
		return nil, errors.New("rdma-probe: --pings must be >= 0 and --slots >= 4")
	}
	return o, nil
}

// checkModes refuses flags that do not go together.
func (o *probeOptions) checkModes() error {
	switch {
	case o.listen != "" && o.peer != "":
		return errors.New("rdma-probe: --listen and --peer exclude each other")
	case o.groupConfig != "" && (o.listen != "" || o.peer != ""):
		return errors.New("rdma-probe: --group-config takes --answer or --measure instead of --listen or --peer")
	case o.groupConfig == "" && (o.answer || o.measure || o.model != ""):
		return errors.New("rdma-probe: --answer, --measure and --model need --group-config FILE and --rank R")
	case o.answer && o.measure:
		return errors.New("rdma-probe: --answer and --measure exclude each other (run --answer on every rank, then --measure on one)")
	}
	return nil
}

// probeReport is what rdma-probe prints.
type probeReport struct {
	OS        string             `json:"os"`
	OSBuild   string             `json:"os_build"`
	RDMACtl   string             `json:"rdma_ctl,omitempty"`
	Bridge    string             `json:"thunderbolt_bridge,omitempty"`
	Library   string             `json:"library"`
	Devices   []rdma.DeviceInfo  `json:"devices"`
	Listening []string           `json:"listening,omitempty"`
	Links     []*rdma.LinkReport `json:"links,omitempty"`
	// Layout mode: the group, the rank's links, and the worst figures of
	// those measured.
	Group      *groupInfo   `json:"group,omitempty"`
	GroupLinks []*probeLink `json:"group_links,omitempty"`
	Profile    *linkProfile `json:"profile,omitempty"`
}

// rdmaProbe runs `decode-worker rdma-probe`: the system's verbs library.
func rdmaProbe(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseProbe(args, out)
	if errors.Is(err, pflag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	lib := o.library
	if lib == "" {
		lib = sysverbs.DefaultLibrary()
	}
	p, err := sysverbs.Load(lib)
	if err != nil {
		return fmt.Errorf("rdma-probe: %w (on macOS: 26.2 or later on a Thunderbolt 5 Mac; on Linux: rdma-core's libibverbs1)", err)
	}
	return runProbe(ctx, o, p, lib, out)
}

// runProbe reports the environment and p's devices (and with a group, the
// rank's links), then listens or probes.
func runProbe(ctx context.Context, o *probeOptions, p verbs.Provider, lib string, out io.Writer) error {
	rep := &probeReport{OS: runtime.GOOS + "/" + runtime.GOARCH, OSBuild: osBuild(), Library: lib}
	if o.groupConfig != "" {
		g, links, err := groupLinks(o)
		if err != nil {
			return err
		}
		rep.Group, rep.GroupLinks = g, links
	}
	if runtime.GOOS == "darwin" {
		rep.RDMACtl = commandOutput("rdma_ctl", "status")
		rep.Bridge = commandOutput("ifconfig", "bridge0")
	}
	devs, err := rdma.Inspect(p)
	rep.Devices = devs
	if err != nil {
		printProbe(out, o.json, rep)
		return fmt.Errorf("rdma-probe: %w", err)
	}
	listen := o.listen
	if o.answer {
		listen = rep.Group.Address
	}
	if listen == "" && o.peer == "" && !o.measure {
		return printProbe(out, o.json, rep)
	}
	cfgs := make([]rdma.Config, len(o.slotSizes))
	for i, s := range o.slotSizes {
		cfgs[i] = rdma.Config{Provider: p, Device: o.device, SlotSize: s, Slots: o.slots}
	}
	if listen != "" {
		addrs, stop, err := listenProbes(cfgs, listen)
		if err != nil {
			return fmt.Errorf("rdma-probe: %w", err)
		}
		defer stop()
		rep.Listening = addrs
		if err := printProbe(out, o.json, rep); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	if o.measure {
		err = measureLinks(ctx, o, cfgs, rep.GroupLinks)
		rep.Profile = worstProfile(rep.GroupLinks)
	} else if _, _, err = splitPort(o.peer); err != nil {
		return fmt.Errorf("rdma-probe: --peer: %w", err)
	} else {
		rep.Links, err = measurePeer(ctx, o, cfgs, o.peer)
	}
	if perr := printProbe(out, o.json, rep); perr != nil {
		return perr
	}
	if err != nil {
		return fmt.Errorf("rdma-probe: %w", err)
	}
	return nil
}

// measurePeer probes the peer answering at addr at each slot size (slot
// size i on addr's port + i), returning what it measured and the errors.
func measurePeer(ctx context.Context, o *probeOptions, cfgs []rdma.Config, addr string) ([]*rdma.LinkReport, error) {
	host, port, err := splitPort(addr)
	if err != nil {
		return nil, err
	}
	var reps []*rdma.LinkReport
	var errs []error
	for i, c := range cfgs {
		t, err := rdma.New(c)
		if err != nil {
			return reps, errors.Join(append(errs, err)...)
		}
		pctx, cancel := context.WithTimeout(ctx, o.timeout)
		r, err := rdma.ProbeLink(pctx, t, net.JoinHostPort(host, strconv.Itoa(port+i)), o.pings, o.bytes, o.frame)
		cancel()
		t.Close()
		if err != nil {
			errs = append(errs, err)
			if r.Frames == 0 && r.RTTP50us == 0 {
				continue
			}
		}
		reps = append(reps, &r)
	}
	return reps, errors.Join(errs...)
}

// listenProbes answers probes for slot size i on addr's port + i; with
// port 0 it looks for a free run of ports.
func listenProbes(cfgs []rdma.Config, addr string) ([]string, func(), error) {
	host, port, err := splitPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--listen: %w", err)
	}
	var lastErr error
	for try := 0; try < 20; try++ {
		var ts []*rdma.Transport
		var ls []*rdma.Listener
		stop := func() {
			for _, l := range ls {
				l.Close()
			}
			for _, t := range ts {
				t.Close()
			}
		}
		base := port
		var addrs []string
		for i, c := range cfgs {
			t, err := rdma.New(c)
			if err != nil {
				stop()
				return nil, nil, err
			}
			ts = append(ts, t)
			a := net.JoinHostPort(host, strconv.Itoa(base+i))
			if base == 0 {
				a = net.JoinHostPort(host, "0")
			}
			l, err := t.Listen(a)
			if err != nil {
				lastErr = err
				break
			}
			ls = append(ls, l)
			if base == 0 {
				_, base, _ = splitPort(l.Addr())
			}
			addrs = append(addrs, l.Addr())
		}
		if len(ls) == len(cfgs) {
			var wg sync.WaitGroup
			for _, l := range ls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rdma.ServeProbes(l)
				}()
			}
			return addrs, func() { stop(); wg.Wait() }, nil
		}
		stop()
		if port != 0 {
			break
		}
	}
	return nil, nil, lastErr
}

func splitPort(addr string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 0 || p > 65535-16 {
		return "", 0, fmt.Errorf("address %q: bad port", addr)
	}
	return host, p, nil
}

// osBuild is the OS release (macOS: its build, which every Mac of a group
// must share).
func osBuild() string {
	if runtime.GOOS == "darwin" {
		return commandOutput("sw_vers", "-buildVersion")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "unknown"
}

// commandOutput runs a short system command for the report; its failure is
// reported as text, not an error.
func commandOutput(name string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	s := strings.TrimSpace(string(b))
	if err != nil {
		return fmt.Sprintf("unavailable (%v) %s", err, s)
	}
	return s
}

func printProbe(out io.Writer, asJSON bool, r *probeReport) error {
	if asJSON {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	}
	fmt.Fprintf(out, "os %s, build %s\nlibrary %s\n", r.OS, r.OSBuild, r.Library)
	if r.RDMACtl != "" {
		fmt.Fprintf(out, "rdma_ctl status: %s\n", r.RDMACtl)
	}
	if r.Bridge != "" {
		fmt.Fprintf(out, "Thunderbolt Bridge (bridge0; should be absent or down): %s\n", r.Bridge)
	}
	if len(r.Devices) == 0 {
		fmt.Fprintln(out, "no RDMA device")
	}
	for _, d := range r.Devices {
		fmt.Fprintf(out, "device %s", d.Name)
		if d.Err != "" {
			fmt.Fprintf(out, ": %s", d.Err)
		}
		fmt.Fprintln(out)
		for _, p := range d.Ports {
			fmt.Fprintf(out, "  port %d %s, MTU %d (max %d), %s, usable %v\n", p.Port, p.State, p.ActiveMTU, p.MaxMTU, p.LinkLayer, p.Usable())
			for _, g := range p.GIDs {
				fmt.Fprintf(out, "    gid[%d] %s\n", g.Index, g.GID)
			}
		}
	}
	for _, a := range r.Listening {
		fmt.Fprintf(out, "answering probes on %s\n", a)
	}
	for _, l := range r.Links {
		printLink(out, "", l)
	}
	printGroup(out, r)
	return nil
}

func printLink(out io.Writer, indent string, l *rdma.LinkReport) {
	fmt.Fprintf(out, "%slink %s, %d slots of %d KiB: rtt p50 %.1f us, p99 %.1f us; %.3f GB/s over %d checked frames (%d bad); slots sent %d, resent %d, dropped damaged %d, out of order %d\n",
		indent, l.Peer, l.Slots, l.SlotSize>>10, l.RTTP50us, l.RTTP99us, l.GBps, l.Frames, l.BadFrames,
		l.Link.SlotsSent, l.Link.Retransmits, l.Link.Corrupt, l.Link.OutOfOrder)
}

// printGroup prints the rank's links, what was measured over them, and how
// to measure them.
func printGroup(out io.Writer, r *probeReport) {
	g := r.Group
	if g == nil {
		return
	}
	fmt.Fprintf(out, "group %s: %d ranks, pipeline %d x tensor %d; rank %d is stage %d, tensor rank %d, answering probes on %s\n",
		g.Name, g.Ranks, g.Stages, g.Tensor, g.Rank, g.Stage, g.TRank, g.Address)
	if len(r.GroupLinks) == 0 {
		fmt.Fprintln(out, "rank", g.Rank, "has no links (a group of one rank)")
		return
	}
	for _, pl := range r.GroupLinks {
		fmt.Fprintf(out, "link to rank %d (stage %d, tensor rank %d; %s): endpoint %s, probes on %s\n",
			pl.Peer, pl.Stage, pl.TRank, strings.Join(pl.Roles, ", "), pl.Endpoint, pl.Address)
		for _, l := range pl.Measured {
			printLink(out, "  ", l)
		}
		if p := pl.Profile; p != nil {
			fmt.Fprintf(out, "  profile: rtt_us %.1f, gb_per_s %.3f (%d KiB slots)\n", p.RTTUS, p.GBps, p.SlotSize>>10)
		}
		if pl.Err != "" {
			fmt.Fprintf(out, "  failed: %s\n", pl.Err)
		}
		if len(pl.Measured) == 0 && pl.Err == "" {
			fmt.Fprintf(out, "  alone: on rank %d `%s`, then here `%s`\n", pl.Peer, pl.Listen, pl.Probe)
		}
	}
	if p := r.Profile; p != nil {
		fmt.Fprintf(out, "worst of rank %d's links, for a hardware profile's link: rtt_us %.1f, gb_per_s %.3f\n", g.Rank, p.RTTUS, p.GBps)
	} else if r.Listening == nil {
		fmt.Fprintf(out, "to measure them all: on every rank P `%s`, then here `%s`\n", g.Answer, g.Measure)
	}
}
