package pipeline

// SetOnCall sets a hook run on the rank's loop after each call of a
// prefill step's layer (tests).
func SetOnCall(w *Worker, f func(layer, lo, hi int)) {
	if f == nil {
		w.onCall.Store(nil)
		return
	}
	w.onCall.Store(&f)
}
