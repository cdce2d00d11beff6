package triplane

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
)

// Tensor is a lazy value: a node of a graph (an op, its inputs and attributes) with the
// shape and dtype the op table infers for it, computed when the node is made. Nothing
// runs until a graph holding it is submitted. A Tensor whose op did not infer (a wrong
// shape, dtype or attribute) carries that error (Err); every op reading it carries the
// same error, and submitting it returns it.
type Tensor struct {
	op     string
	inputs []*Tensor
	attrs  map[string]any // normalised: defaults filled
	typ    TensorType
	loc    string
	id     string // an explicit node id (WithID), else one is given when a graph is made
	seq    uint64
	err    error
}

var seqCounter atomic.Uint64

// Option sets an attribute of an op (the With... functions) or the node's id (WithID).
type Option func(*opArgs)

type opArgs struct {
	attrs map[string]any
	id    string
}

func withAttr(name string, v any) Option {
	return func(o *opArgs) { o.attrs[name] = v }
}

// WithAttr sets any attribute by name (the typed With... options are the usual way).
func WithAttr(name string, v any) Option { return withAttr(name, v) }

// WithID names the node (by default nodes are named n1, n2, ... when a graph is made).
func WithID(id string) Option { return func(o *opArgs) { o.id = id } }

// Op is the node's op name.
func (t *Tensor) Op() string { return t.op }

// Shape is the inferred shape (nil when Err is set).
func (t *Tensor) Shape() []int { return append([]int(nil), t.typ.Shape...) }

// DType is the inferred dtype ("" when Err is set).
func (t *Tensor) DType() DType { return t.typ.DType }

// Type is the inferred shape and dtype.
func (t *Tensor) Type() TensorType { return TensorType{t.Shape(), t.typ.DType} }

// Loc is the caller's file:line that made the node.
func (t *Tensor) Loc() string { return t.loc }

// Attrs are the node's normalised attributes (a copy).
func (t *Tensor) Attrs() map[string]any {
	out := make(map[string]any, len(t.attrs))
	for k, v := range t.attrs {
		out[k] = v
	}
	return out
}

// Err is the error of the op that made this tensor or of one before it, or nil.
func (t *Tensor) Err() error { return t.err }

func (t *Tensor) String() string {
	if t.err != nil {
		return fmt.Sprintf("Tensor(%s: %v)", t.op, t.err)
	}
	return fmt.Sprintf("Tensor(%s %s at %s)", t.op, t.typ, t.loc)
}

var packageDir string

func init() {
	_, file, _, _ := runtime.Caller(0)
	packageDir = filepath.Dir(file)
}

// callerLoc is "file.go:line" of the first caller outside this package's own sources
// (its tests count as callers), so a node made inside Linear or Adam is located at the
// user's call of Linear or Adam.
func callerLoc() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if f.File != "" && (filepath.Dir(f.File) != packageDir || strings.HasSuffix(f.File, "_test.go")) {
			return fmt.Sprintf("%s:%d", filepath.Base(f.File), f.Line)
		}
		if !more {
			return ""
		}
	}
}

// apply makes the node op(inputs; attrs + options), inferring its type now: a wrong
// shape is an *Error at this call, naming the input types and the caller's file:line.
func apply(op string, inputs []*Tensor, attrs map[string]any, opts []Option) *Tensor {
	args := opArgs{attrs: map[string]any{}}
	for k, v := range attrs {
		args.attrs[k] = v
	}
	for _, o := range opts {
		o(&args)
	}
	t := &Tensor{op: op, inputs: inputs, loc: callerLoc(), id: args.id, seq: seqCounter.Add(1)}
	types := make([]TensorType, len(inputs))
	for i, in := range inputs {
		if in == nil {
			t.err = &Error{Kind: KindGraph, Op: op, Loc: t.loc, Message: fmt.Sprintf("%s: input %d is nil (at %s)", op, i, t.loc)}
			return t
		}
		if in.err != nil {
			t.err = in.err
			return t
		}
		types[i] = in.typ
	}
	typ, norm, err := InferType(op, types, args.attrs)
	if err != nil {
		e := err.(*Error)
		msg := op + ": " + e.Message
		if len(types) > 0 {
			parts := make([]string, len(types))
			for i, ty := range types {
				parts[i] = ty.String()
			}
			msg += "; inputs " + strings.Join(parts, ", ")
		}
		t.err = &Error{Kind: e.Kind, Op: op, Loc: t.loc, Message: msg + " (at " + t.loc + ")"}
		return t
	}
	t.attrs, t.typ = norm, typ
	return t
}

// Graph is a set of tensors and the outputs asked of them, with node ids: what is
// submitted to the cluster, serialised (CanonicalJSON) and hashed as every SDK does.
type Graph struct {
	nodes   []*Tensor // in creation order
	ids     map[*Tensor]string
	byID    map[string]*Tensor
	outputs []*Tensor
}

// NewGraph collects every node the outputs read. Nodes without an explicit id (WithID)
// are named prefix1, prefix2, ... in the order they were made (prefix "n" by default,
// as the Python Builder names them). The first node error is returned.
func NewGraph(outputs []*Tensor, prefix ...string) (*Graph, error) {
	p := "n"
	if len(prefix) > 0 {
		p = prefix[0]
	}
	g := &Graph{ids: map[*Tensor]string{}, byID: map[string]*Tensor{}, outputs: outputs}
	seen := map[*Tensor]bool{}
	var visit func(t *Tensor) error
	visit = func(t *Tensor) error {
		if t == nil {
			return newError(KindGraph, "a nil tensor in the graph")
		}
		if t.err != nil {
			return t.err
		}
		if seen[t] {
			return nil
		}
		seen[t] = true
		for _, in := range t.inputs {
			if err := visit(in); err != nil {
				return err
			}
		}
		g.nodes = append(g.nodes, t)
		return nil
	}
	for _, o := range outputs {
		if err := visit(o); err != nil {
			return nil, err
		}
	}
	sortBySeq(g.nodes)
	for _, t := range g.nodes {
		if t.id != "" {
			if other, dup := g.byID[t.id]; dup && other != t {
				return nil, newError(KindGraph, fmt.Sprintf("two nodes are named %q", t.id))
			}
			g.byID[t.id] = t
			g.ids[t] = t.id
		}
	}
	k := 0
	for _, t := range g.nodes {
		if t.id != "" {
			continue
		}
		for {
			k++
			id := fmt.Sprintf("%s%d", p, k)
			if _, taken := g.byID[id]; !taken {
				g.byID[id], g.ids[t] = t, id
				break
			}
		}
	}
	return g, nil
}

func sortBySeq(ts []*Tensor) {
	for i := 1; i < len(ts); i++ { // insertion sort: graphs arrive nearly sorted
		for j := i; j > 0 && ts[j].seq < ts[j-1].seq; j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// ID is the node id of t in the graph ("" when t is not in it).
func (g *Graph) ID(t *Tensor) string { return g.ids[t] }

// Node is the tensor named id (nil when none is).
func (g *Graph) Node(id string) *Tensor { return g.byID[id] }

// Len is the number of nodes.
func (g *Graph) Len() int { return len(g.nodes) }

func (g *Graph) document(withLoc bool) map[string]any {
	nodes := make(map[string]any, len(g.nodes))
	for _, t := range g.nodes {
		n := map[string]any{"op": t.op, "shape": t.typ.Shape, "dtype": string(t.typ.DType)}
		if len(t.inputs) > 0 {
			ins := make([]string, len(t.inputs))
			for i, in := range t.inputs {
				ins[i] = g.ids[in]
			}
			n["inputs"] = ins
		}
		if len(t.attrs) > 0 {
			n["attrs"] = t.attrs
		}
		if withLoc && t.loc != "" {
			n["loc"] = t.loc
		}
		nodes[g.ids[t]] = n
	}
	outs := make([]string, len(g.outputs))
	for i, o := range g.outputs {
		outs[i] = g.ids[o]
	}
	return map[string]any{"version": 1, "nodes": nodes, "outputs": outs}
}

// CanonicalJSON is the graph's canonical bytes (proto/README.md), as every SDK writes them.
func (g *Graph) CanonicalJSON() ([]byte, error) { return CanonicalJSON(g.document(false)) }

// Hash is the lowercase hex SHA-256 of the canonical bytes: the graph's name.
func (g *Graph) Hash() (string, error) {
	b, err := g.CanonicalJSON()
	if err != nil {
		return "", err
	}
	return Hash(b), nil
}

// wire is the document as submitted: the canonical form plus each node's loc.
func (g *Graph) wire() map[string]any { return g.document(true) }
