package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
)

// Store is the worker's prefix store (nil: none).
func (w *Worker) Store() *prefixstore.Store { return w.cfg.Store }

// withStore prepares a job against the prefix store: the longest stored
// prefix of its tokens becomes its Base (only the rest is prefilled), and
// when its tokens end on the store's grid the state the sink gets is also
// written to the store, as a new entry that supersedes the one it resumed
// from. A store that fails (a corrupt file, a full disk) costs the job its
// shortcut, never its result: the error is logged and the job prefills
// from scratch, or leaves no entry.
func (w *Worker) withStore(spec Spec) Spec {
	st := w.cfg.Store
	if st == nil || spec.Base != nil || len(spec.Tokens) < prefixstore.Block {
		return spec
	}
	n := len(spec.Tokens)
	from := ""
	// The store keys an image's rows by the image's hash.
	key := prefixkey.Fold(spec.Tokens, spec.Images)
	// Keep one token to prefill unless the whole prompt is stored (a
	// retried job): the pass then has nothing to do and the sink gets the
	// stored state.
	hit, err := st.Lookup(key, n, n)
	if err != nil {
		w.cfg.Log.Warn("prefix store: a stored prefix failed its checks and was removed; prefilling without it",
			zap.String("job", spec.ID), zap.Error(err))
	}
	if hit != nil {
		spec.Media = model.MediaWindow(spec.Media, hit.Tokens, n, w.model.HiddenSize)
		spec.Encode = afterBase(spec.Encode, spec.Images, hit.Tokens, n, w.model.HiddenSize)
		spec.Base, spec.Tokens, from = hit.State, spec.Tokens[hit.Tokens:], hit.Key
		w.cfg.Log.Info("prefix store hit", zap.String("job", spec.ID), zap.Int("cached", hit.Tokens), zap.Int("prefill", len(spec.Tokens)))
	}
	if n%prefixstore.Block == 0 && (hit == nil || hit.Tokens < n) {
		wr, err := st.Create(key, from)
		if err != nil {
			w.cfg.Log.Warn("prefix store: entry not started", zap.String("job", spec.ID), zap.Error(err))
			return spec
		}
		spec.Sink = &storeTee{LayerSink: spec.Sink, w: wr, log: w.cfg.Log.With(zap.String("job", spec.ID))}
	}
	return spec
}

// storeTee writes each layer to a store entry on its way to the job's
// sink, and commits the entry once the sink committed the state.
type storeTee struct {
	model.LayerSink
	w   *prefixstore.Writer
	log *zap.Logger

	mu     sync.Mutex // Abort may come from another goroutine than the puts
	failed bool
}

func (t *storeTee) PutLayer(ctx context.Context, ls *model.LayerState) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.failed {
		if err := t.w.Put(ls); err != nil {
			t.failed = true
			t.w.Abort()
			t.log.Warn("prefix store: entry given up", zap.Error(err))
		}
	}
	return t.LayerSink.PutLayer(ctx, ls)
}

func (t *storeTee) Close(ctx context.Context, tokens int) error {
	err := t.LayerSink.Close(ctx, tokens)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.failed:
	case err != nil || tokens != t.w.Tokens():
		t.w.Abort()
	default:
		if cerr := t.w.Commit(); cerr != nil {
			t.log.Warn("prefix store: entry not kept", zap.Error(cerr))
		}
	}
	return err
}

func (t *storeTee) Abort(err error) {
	t.giveUp()
	t.LayerSink.Abort(err)
}

func (t *storeTee) giveUp() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.failed {
		t.failed = true
		t.w.Abort()
	}
}

// untee gives up the store entries of jobs that were not queued.
func untee(specs []Spec) {
	for _, s := range specs {
		if t, ok := s.Sink.(*storeTee); ok {
			t.giveUp()
		}
	}
}

// errNoStore is returned by store operations on a worker without one.
var errNoStore = errors.New("prefill worker: no prefix store")

// StoreList lists the prefix store's entries.
func (w *Worker) StoreList() ([]prefixstore.Info, error) {
	if w.cfg.Store == nil {
		return nil, errNoStore
	}
	return w.cfg.Store.List(), nil
}

// StoreDrop drops the store's entry key, or every entry when key is empty.
func (w *Worker) StoreDrop(key string) (int, error) {
	if w.cfg.Store == nil {
		return 0, fmt.Errorf("%w to drop from", errNoStore)
	}
	return w.cfg.Store.Drop(key), nil
}

// afterBase is a job's Encode once it resumes from a stored prefix of base
// tokens: the media of the rest of the prompt, or nil (no tower run) when
// every image lies in the stored prefix.
func afterBase(enc func(context.Context) ([]model.Media, error), imgs []prefixkey.Image, base, n, d int) func(context.Context) ([]model.Media, error) {
	if enc == nil || len(imgs) == 0 || imgs[len(imgs)-1].At+imgs[len(imgs)-1].Len <= base {
		return nil
	}
	return func(ctx context.Context) ([]model.Media, error) {
		md, err := enc(ctx)
		return model.MediaWindow(md, base, n, d), err
	}
}
