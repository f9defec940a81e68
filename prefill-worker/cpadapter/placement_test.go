package cpadapter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testkit.Isolated(m)) }

// tensorPlacement is a prefill assignment of prompt to a group of stages
// x tensor ranks listening on eps (stage-major), the stages splitting n
// layers.
func tensorPlacement(prompt []int32, n, stages, tensor int, eps []string) *cp.Assignment {
	as := &cp.Assignment{JobID: "j-tp", Role: cp.RolePrefill, WorkerID: "pf", GroupID: "g", Client: "c", TokenIDs: prompt,
		Sampling: cp.Sampling{MaxTokens: 1}}
	secret := cp.NewSecret()
	for r, ep := range eps {
		s := r / tensor
		p := cp.LayerPlacement{Rank: r, WorkerID: fmt.Sprintf("d%d", r), Layers: cp.LayerRange{First: s * n / stages, End: (s + 1) * n / stages},
			Transfer: ep, SessionID: "s-tp", Secret: secret}
		if tensor > 1 {
			p.TensorRank, p.TensorRanks = r%tensor, tensor
		}
		as.Placement = append(as.Placement, p)
	}
	return as
}

// TestTensorRanksGetTheirSlices prefills a prompt on the prefill worker and
// ships it, by the placement an assignment to a 1x2 and a 2x2 group gives,
// through kvtransfer to ranks that expect their shard: each commits
// exactly its slice (model.Config.ShardSeqState) of the state the model
// core prefills alone, byte for byte, and receives only its slice's bytes.
func TestTensorRanksGetTheirSlices(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	w, err := worker.New(worker.Config{Model: dir, Budget: 64 << 20, Threads: 1, Log: zap.NewNop(), ReadSize: 64 << 10, SinkTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := w.Model()
	prompt := make([]int32, 23)
	for i := range prompt {
		prompt[i] = int32((i*31 + 5) % c.VocabSize)
	}
	whole := reference(t, dir, prompt)
	a := &Adapter{cfg: Config{WorkerID: "pf", Worker: w}, log: zap.NewNop()}
	ctx := context.Background()
	for _, tc := range []struct{ stages, tensor int }{{1, 2}, {2, 2}, {2, 1}} {
		name := fmt.Sprintf("%dx%d", tc.stages, tc.tensor)
		var srvs []*kvtransfer.Server
		var eps []string
		for range tc.stages * tc.tensor {
			srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			srvs, eps = append(srvs, srv), append(eps, srv.Addr())
		}
		as := tensorPlacement(prompt, c.NumLayers, tc.stages, tc.tensor, eps)
		as.JobID = "j-" + name
		if err := as.Validate(); err != nil {
			t.Fatal(err)
		}
		place, session, secret, err := a.placement(as)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		deadline := time.Now().Add(20 * time.Second)
		var ins []*kvtransfer.Incoming
		for i, p := range as.Placement {
			var layers []int
			for L := p.Layers.First; L < p.Layers.End; L++ {
				layers = append(layers, L)
			}
			in, err := srvs[i].Expect(kvtransfer.ExpectSpec{Session: session, Secret: secret, Model: c, Layers: layers, Tokens: len(prompt),
				Shard: model.Shard{Rank: p.TensorRank, Ranks: p.TensorRanks}, Deadline: deadline})
			if err != nil {
				t.Fatal(err)
			}
			ins = append(ins, in)
		}
		snd, err := kvtransfer.NewSender(kvtransfer.SenderConfig{Job: as.JobID, Session: session, Secret: secret, Placement: place, Deadline: deadline})
		if err != nil {
			t.Fatal(err)
		}
		h, err := w.Submit(worker.Spec{ID: as.JobID, Tokens: prompt, Sink: sink.Suffix(snd, 0), Deadline: deadline})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Wait(ctx); err != nil {
			t.Fatalf("%s: prefill and transfer: %v", name, err)
		}
		var sent int64
		for i, in := range ins {
			st, err := in.Wait(ctx)
			if err != nil {
				t.Fatalf("%s rank %d: %v", name, i, err)
			}
			p := as.Placement[i]
			s := model.Shard{Rank: p.TensorRank, Ranks: p.TensorRanks}
			want, err := c.ShardSeqState(whole, s)
			if err != nil {
				t.Fatal(err)
			}
			var layers []int
			var bytes, unsplit int64
			for L := p.Layers.First; L < p.Layers.End; L++ {
				layers = append(layers, L)
				bytes += int64(want.Layers[L].Bytes())
				unsplit += int64(whole.Layers[L].Bytes())
			}
			if err := kvtest.Diff(want, st, layers); err != nil {
				t.Fatalf("%s rank %d (%s): %v", name, i, s, err)
			}
			if got, _ := in.Progress(); got != bytes || (tc.tensor > 1) != (bytes < unsplit) {
				t.Errorf("%s rank %d: received %d bytes, want its slice's %d (unsplit %d)", name, i, got, bytes, unsplit)
			}
			sent += bytes
		}
		if st := snd.Stats(); st.ChunksResent == 0 && st.BytesSent != sent {
			t.Errorf("%s: sent %d bytes, the ranks' slices hold %d", name, st.BytesSent, sent)
		}
	}
}

// reference prefills prompt alone on the in-memory model core.
func reference(t *testing.T, dir string, prompt []int32) *model.SeqState {
	t.Helper()
	m, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := m.NewState(0, m.Cfg.NumLayers)
	if err := m.PrefillState(context.Background(), []*model.SeqState{s}, [][]int32{prompt}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPlacementRefusesBadStages: a placement whose stage lacks a tensor
// rank is refused by the prefill worker, naming the layer.
func TestPlacementRefusesBadStages(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	w, err := worker.New(worker.Config{Model: dir, Budget: 64 << 20, Threads: 1, Log: zap.NewNop(), ReadSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	a := &Adapter{cfg: Config{WorkerID: "pf", Worker: w}, log: zap.NewNop()}
	as := tensorPlacement([]int32{1, 2}, w.Model().NumLayers, 1, 2, []string{"h:1", "h:2"})
	as.Placement[1].TensorRank = 0 // two tensor ranks 0
	if _, _, _, err := a.placement(as); err == nil || !strings.Contains(err.Error(), "tensor rank 0 missing, repeated") {
		t.Fatalf("a stage with tensor rank 0 twice: %v", err)
	}
}
