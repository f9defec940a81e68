package pipeline

import (
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

type nopSink struct{}

func (nopSink) Token(string, int, int32) {}
func (nopSink) End(string, Result)       {}

func TestStartRefusesBadConfig(t *testing.T) {
	b, err := configs.ModelPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(c, cpu.New(1)) // nothing resident
	l, err := rank.Even("g", c.NumLayers, []string{"127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Model: m}, "layout and a model"},
		{Config{Layout: l}, "layout and a model"},
		{Config{Layout: l, Model: m, Rank: 1}, "not in group"},
		{Config{Layout: l, Model: m}, "not loaded"},
		{Config{Layout: &rank.Layout{Group: "g", Ranks: []rank.Spec{{Endpoint: "a:1", Lo: 0, Hi: 3}}}, Model: m}, "model has 9"},
	} {
		if _, err := Start(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v", tc.want, err)
		}
	}
}

func TestRequestValidate(t *testing.T) {
	ok := Request{ID: "a", Tokens: []int32{1, 2}, MaxTokens: 3, Sink: nopSink{}}
	if err := ok.validate(10, 2, 4); err != nil {
		t.Fatal(err)
	}
	sess := []Session{{ID: "s", Secret: []byte("0123456789abcdef")}, {ID: "s", Secret: []byte("0123456789abcdef")}}
	remote := ok
	remote.Remote = &Remote{Tokens: 5, Sessions: sess, Deadline: time.Now().Add(time.Minute)}
	if err := remote.validate(10, 2, 4); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mod  func(*Request)
		want string
	}{
		{func(r *Request) { r.ID = "" }, "id"},
		{func(r *Request) { r.Tokens = nil }, "no tokens"},
		{func(r *Request) { r.MaxTokens = 0 }, "max tokens"},
		{func(r *Request) { r.Sink = nil }, "sink"},
		{func(r *Request) { r.Tokens = []int32{10} }, "outside the vocabulary"},
		{func(r *Request) { r.Stop = []int32{-1} }, "stop token"},
		{func(r *Request) { r.Sampling = sampling.Params{TopK: -1} }, "top_k"},
		{func(r *Request) {
			r.Remote = &Remote{Tokens: 5, Sessions: sess[:1], Deadline: time.Now().Add(time.Minute)}
		}, "2 ranks"},
		{func(r *Request) { r.Remote = &Remote{Tokens: 5, Sessions: sess} }, "deadline"},
		{func(r *Request) {
			r.Remote = &Remote{Tokens: 5, Sessions: []Session{sess[0], {ID: "s"}}, Deadline: time.Now().Add(time.Minute)}
		}, "rank 1's transfer session"},
		{func(r *Request) {
			r.Remote = &Remote{Tokens: -1, Sessions: sess, Deadline: time.Now().Add(time.Minute)}
		}, "remote state of -1"},
	} {
		r := ok
		tc.mod(&r)
		if err := r.validate(10, 2, 4); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v", tc.want, err)
		}
	}
}
