package service_test

import (
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestRemoteJobOnTensorRanks: a decode group of one stage of two tensor
// ranks registers their tensor ranks, the coordinator places a remote job
// on them, the prefill worker ships each its slice of the state, and the
// job generates the monolithic model's tokens; each rank received its
// slice only, fewer bytes than the whole state.
func TestRemoteJobOnTensorRanks(t *testing.T) {
	opt := testOptions(t)
	opt.Ranks, opt.Tensor = 2, 2
	c := startCluster(t, opt)
	ref := testmodel.LoadReference(t, opt.ModelDir, 1)
	nc := connect(t, c)
	p := testkit.Prompt(200, c.Model.VocabSize, 3)
	res := run(t, nc, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 10}, Policy: cp.PolicyRemote})
	checkDone(t, res, ref.Greedy(t, p, 10), cp.TargetRemote)

	whole := ref.RemoteState(t, p)
	var sum int64
	for r := range c.Group.Layout.Ranks {
		slice, err := ref.Cfg.ShardSeqState(whole, c.Group.Layout.Shard(r))
		if err != nil {
			t.Fatal(err)
		}
		got := c.Group.Server(r).Stats().BytesVerified
		if want := int64(slice.Bytes()); got != want || got >= int64(whole.Bytes()) {
			t.Errorf("rank %d received %d bytes, want its slice's %d (the whole state %d)", r, got, want, whole.Bytes())
		}
		sum += got
	}
	t.Logf("state of %d tokens: %d bytes whole, %d sent to the two tensor ranks", len(p)-1, whole.Bytes(), sum)
}
