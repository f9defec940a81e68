package grammar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Limits of a Grammar's caches.
const (
	// MaxStates bounds the automaton states a Grammar determinizes; a
	// sequence that needs more fails (ErrTooComplex).
	MaxStates = 1 << 15
	// maxMaskWords bounds the masks a Grammar keeps (8 MiB: 400 masks of
	// K3's vocabulary); when full it forgets them all.
	maxMaskWords = 1 << 20
)

// ErrRejected reports a token the grammar does not allow.
var ErrRejected = errors.New("grammar: token not allowed")

// ErrTooComplex reports a grammar whose automaton outgrew MaxStates.
var ErrTooComplex = errors.New("grammar: the automaton has too many states")

// Grammar is a compiled Spec: an automaton over bytes and markers,
// determinized lazily, with the masks of the states it has met cached. It
// is safe for concurrent use; Matchers of many sequences share it.
type Grammar struct {
	spec Spec
	prog []instr
	eom  int32 // the instruction reading <|end_of_msg|>

	mu     sync.Mutex
	states []*dstate
	index  map[string]int32
	masks  map[maskKey][]uint64
	walk   []int32 // scratch: the state by trie depth
	words  int     // in masks
}

type maskKey struct {
	v *Vocabulary
	s int32
}

// config is a configuration of the machine: an instruction and its stack
// of return addresses (4 bytes each, innermost last).
type config struct {
	pc    int32
	stack string
}

type dstate struct {
	configs []config
	final   bool            // the message is closed: only <|end_of_msg|> is left
	next    *[numSyms]int32 // by symbol: the next state, -1 dead, -2 not yet known
}

const unknown, dead = -2, -1

// Compile builds the Grammar of spec.
func Compile(spec *Spec) (*Grammar, error) {
	if spec == nil {
		return nil, errors.New("grammar: no spec")
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	prog, eom, err := compile(spec)
	if err != nil {
		return nil, err
	}
	g := &Grammar{spec: *spec, prog: prog, eom: eom, index: map[string]int32{}, masks: map[maskKey][]uint64{}}
	start := g.closure([]config{{pc: 0}})
	if _, err := g.intern(start); err != nil {
		return nil, err
	}
	return g, nil
}

// Spec returns the spec the Grammar was compiled from.
func (g *Grammar) Spec() Spec { return g.spec }

// closure follows the jumps, splits, calls and returns from cs to the
// instructions that read a symbol (or match).
func (g *Grammar) closure(cs []config) []config {
	var out []config
	seen := map[config]bool{}
	var visit func(c config)
	visit = func(c config) {
		if seen[c] {
			return
		}
		seen[c] = true
		in := &g.prog[c.pc]
		switch in.op {
		case opSym, opMatch:
			out = append(out, c)
		case opJmp:
			visit(config{in.x, c.stack})
		case opSplit:
			visit(config{in.x, c.stack})
			visit(config{in.y, c.stack})
		case opCall:
			if len(c.stack)/4 >= maxStack {
				return // nested too deep
			}
			var ret [4]byte
			binary.LittleEndian.PutUint32(ret[:], uint32(c.pc+1))
			visit(config{in.x, c.stack + string(ret[:])})
		case opRet:
			if len(c.stack) == 0 {
				return
			}
			n := len(c.stack) - 4
			visit(config{int32(binary.LittleEndian.Uint32([]byte(c.stack[n:]))), c.stack[:n]})
		}
	}
	for _, c := range cs {
		visit(c)
	}
	return out
}

// intern returns the state of the configurations cs (after closure).
func (g *Grammar) intern(cs []config) (int32, error) {
	if len(cs) == 0 {
		return dead, nil
	}
	slices.SortFunc(cs, func(a, b config) int {
		if a.pc != b.pc {
			return int(a.pc - b.pc)
		}
		return strings.Compare(a.stack, b.stack)
	})
	cs = slices.Compact(cs)
	var k []byte
	for _, c := range cs {
		k = binary.LittleEndian.AppendUint32(k, uint32(c.pc))
		k = binary.LittleEndian.AppendUint16(k, uint16(len(c.stack)))
		k = append(k, c.stack...)
	}
	if s, ok := g.index[string(k)]; ok {
		return s, nil
	}
	if len(g.states) >= MaxStates {
		return dead, ErrTooComplex
	}
	st := &dstate{configs: cs}
	for _, c := range cs {
		st.final = st.final || c.pc == g.eom || g.prog[c.pc].op == opMatch
	}
	s := int32(len(g.states))
	g.states = append(g.states, st)
	g.index[string(k)] = s
	return s, nil
}

// trans returns the state after s reads sym (dead if none). g.mu is held.
func (g *Grammar) trans(s int32, sym int) (int32, error) {
	st := g.states[s]
	if st.next == nil {
		st.next = new([numSyms]int32)
		for i := range st.next {
			st.next[i] = unknown
		}
	}
	if t := st.next[sym]; t != unknown {
		return t, nil
	}
	var moved []config
	for _, c := range st.configs {
		in := &g.prog[c.pc]
		if in.op == opSym && in.cls.has(sym) {
			moved = append(moved, config{c.pc + 1, c.stack})
		}
	}
	t, err := g.intern(g.closure(moved))
	if err != nil {
		return dead, err
	}
	st.next[sym] = t
	return t, nil
}

// mask returns the mask of state s over v, cached. g.mu is held; the
// result is shared and must not be changed.
func (g *Grammar) mask(v *Vocabulary, s int32) ([]uint64, error) {
	if m, ok := g.masks[maskKey{v, s}]; ok {
		return m, nil
	}
	m := make([]uint64, v.MaskWords())
	for sym := 256; sym < numSyms; sym++ {
		t, err := g.trans(s, sym)
		if err != nil {
			return nil, err
		}
		if t != dead {
			id := v.markerID(sym)
			m[id/64] |= 1 << (id % 64)
		}
	}
	// Walk the trie in preorder, skipping the subtrees of dead prefixes.
	if cap(g.walk) < v.maxD+1 {
		g.walk = make([]int32, v.maxD+1)
	}
	at := g.walk[:v.maxD+1]
	at[0] = s
	for i, n := int32(1), int32(len(v.sym)); i < n; {
		d := v.depth[i]
		t, err := g.trans(at[d-1], int(v.sym[i]))
		if err != nil {
			return nil, err
		}
		if t == dead {
			i = v.end[i]
			continue
		}
		at[d] = t
		if id := v.id[i]; id >= 0 {
			m[id/64] |= 1 << (id % 64)
			for _, dup := range v.dups[i] {
				m[dup/64] |= 1 << (dup % 64)
			}
		}
		i++
	}
	if g.words+len(m) > maxMaskWords {
		clear(g.masks)
		g.words = 0
	}
	g.masks[maskKey{v, s}] = m
	g.words += len(m)
	return m, nil
}

// Matcher follows one sequence's tokens through a Grammar. It is not safe
// for concurrent use.
type Matcher struct {
	g        *Grammar
	v        *Vocabulary
	s        int32
	thinking bool // in the think channel
	thought  int  // tokens in it
	ended    bool // <|end_of_msg|> accepted
	buf      []int
}

// NewMatcher returns a Matcher at the start of the reply, reading ids of
// v.
func (g *Grammar) NewMatcher(v *Vocabulary) *Matcher {
	return &Matcher{g: g, v: v, s: 0, thinking: g.spec.Thinking}
}

// budgetSpent reports that the think channel must close now.
func (m *Matcher) budgetSpent() bool {
	return m.thinking && m.g.spec.ThinkBudget > 0 && m.thought >= m.g.spec.ThinkBudget
}

// Mask writes into dst (MaskWords words) the ids allowed next: bit id of
// word id/64.
func (m *Matcher) Mask(dst []uint64) error {
	if len(dst) < m.v.MaskWords() {
		return fmt.Errorf("grammar: mask of %d words, need %d", len(dst), m.v.MaskWords())
	}
	dst = dst[:m.v.MaskWords()]
	if m.budgetSpent() {
		clear(dst)
		id := m.v.markerID(symClose)
		dst[id/64] |= 1 << (id % 64)
		return nil
	}
	m.g.mu.Lock()
	mask, err := m.g.mask(m.v, m.s)
	if err == nil {
		copy(dst, mask)
	}
	m.g.mu.Unlock()
	return err
}

// Accept moves past token id; it fails (ErrRejected) if the grammar does
// not allow id, and then the Matcher is unchanged.
func (m *Matcher) Accept(id int) error {
	syms, ok := m.v.symbols(id, m.buf)
	m.buf = syms
	if !ok {
		return fmt.Errorf("%w: id %d is not a token the grammar reads", ErrRejected, id)
	}
	if m.budgetSpent() && (len(syms) != 1 || syms[0] != symClose) {
		return fmt.Errorf("%w: id %d after the think budget", ErrRejected, id)
	}
	m.g.mu.Lock()
	s := m.s
	var err error
	for _, sym := range syms {
		if s, err = m.g.trans(s, sym); err != nil || s == dead {
			break
		}
	}
	m.g.mu.Unlock()
	if err != nil {
		return err
	}
	if s == dead {
		return fmt.Errorf("%w: id %d", ErrRejected, id)
	}
	m.s = s
	m.ended = len(syms) == 1 && syms[0] == symEOM
	if m.thinking {
		if len(syms) == 1 && syms[0] == symClose {
			m.thinking = false
		} else {
			m.thought++
		}
	}
	return nil
}

// Done reports that the reply is complete: the message is closed and only
// <|end_of_msg|> (or nothing, after it) may follow. The sequence should
// stop.
func (m *Matcher) Done() bool {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return m.g.states[m.s].final
}

// Ended reports that the last token accepted was the <|end_of_msg|> that
// ends the reply: the sequence ends with it.
func (m *Matcher) Ended() bool { return m.ended }

// Cache compiles each distinct Spec once. It is safe for concurrent use.
type Cache struct {
	mu    sync.Mutex
	max   int
	byKey map[string]*Grammar
	order []string // oldest first
}

// NewCache returns a cache of at most max grammars (the oldest goes
// first).
func NewCache(size int) *Cache {
	return &Cache{max: max(size, 1), byKey: map[string]*Grammar{}}
}

// Get returns the Grammar of spec, compiling it if the cache lacks it.
func (c *Cache) Get(spec *Spec) (*Grammar, error) {
	if spec == nil {
		return nil, errors.New("grammar: no spec")
	}
	key := specKey(spec)
	c.mu.Lock()
	g, ok := c.byKey[key]
	c.mu.Unlock()
	if ok {
		return g, nil
	}
	g, err := Compile(spec)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.byKey[key]; ok {
		return old, nil
	}
	for len(c.order) >= c.max {
		delete(c.byKey, c.order[0])
		c.order = c.order[1:]
	}
	c.byKey[key] = g
	c.order = append(c.order, key)
	return g, nil
}

// specKey is a Spec's identity: its fields, length-prefixed.
func specKey(s *Spec) string {
	var b strings.Builder
	field := func(v string) { fmt.Fprintf(&b, "%d:%s", len(v), v) }
	field(string(s.Mode))
	fmt.Fprintf(&b, "%t/%d/", s.Thinking, s.ThinkBudget)
	field(s.Tool)
	field(string(s.Schema))
	for _, t := range s.Tools {
		field(t.Name)
		field(string(t.Parameters))
	}
	return b.String()
}
