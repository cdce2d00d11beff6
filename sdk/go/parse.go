package triplane

import (
	"fmt"
	"sort"
)

// ParseGraph reads a graph document (proto/README.md): every node is inferred again by
// the op table, and a declared shape or dtype that differs from the inferred one is an
// error. Node ids are kept; nodes no output reads are kept too.
func ParseGraph(doc []byte) (*Graph, error) {
	v, err := decodeJSON(doc)
	if err != nil {
		return nil, newError(KindGraph, "graph JSON: "+err.Error())
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, newError(KindGraph, "a graph document is a JSON object")
	}
	for k := range top {
		if k != "version" && k != "nodes" && k != "outputs" {
			return nil, newError(KindGraph, fmt.Sprintf("unknown field %q in a graph document", k))
		}
	}
	if ver, ok := top["version"]; ok {
		if n, isInt := asInt(ver); !isInt || n != 1 {
			return nil, newError(KindGraph, fmt.Sprintf("unsupported graph version %v", ver))
		}
	}
	raw, ok := top["nodes"].(map[string]any)
	if !ok {
		return nil, newError(KindGraph, "a graph document needs \"nodes\": an object")
	}
	built := map[string]*Tensor{}
	busy := map[string]bool{}
	var build func(id string) (*Tensor, error)
	build = func(id string) (*Tensor, error) {
		if t := built[id]; t != nil {
			return t, nil
		}
		if busy[id] {
			return nil, &Error{Kind: KindGraph, Node: id, Message: fmt.Sprintf("node %q: the graph has a cycle through it", id)}
		}
		node, ok := raw[id].(map[string]any)
		if !ok {
			return nil, &Error{Kind: KindGraph, Node: id, Message: fmt.Sprintf("node %q is not in the graph (or not an object)", id)}
		}
		busy[id] = true
		defer delete(busy, id)
		op, _ := node["op"].(string)
		for k := range node {
			switch k {
			case "op", "inputs", "attrs", "shape", "dtype":
			default:
				return nil, &Error{Kind: KindGraph, Node: id, Op: op, Message: fmt.Sprintf("node %q: unknown field %q", id, k)}
			}
		}
		var inputs []*Tensor
		if l, ok := node["inputs"].([]any); ok {
			for _, in := range l {
				s, isStr := in.(string)
				if !isStr {
					return nil, &Error{Kind: KindGraph, Node: id, Op: op, Message: fmt.Sprintf("node %q: input ids are strings", id)}
				}
				t, err := build(s)
				if err != nil {
					return nil, err
				}
				inputs = append(inputs, t)
			}
		}
		attrs, _ := node["attrs"].(map[string]any)
		types := make([]TensorType, len(inputs))
		for i, in := range inputs {
			types[i] = in.typ
		}
		typ, norm, err := InferType(op, types, attrs)
		if err != nil {
			e := *err.(*Error)
			e.Node, e.Op = id, op
			e.Message = fmt.Sprintf("node %q (%s): %s", id, op, e.Message)
			return nil, &e
		}
		if s, ok := node["shape"]; ok {
			l, isInts := asInts(s)
			if !isInts || !sameShape(intsOf(l), typ.Shape) {
				return nil, &Error{Kind: KindShape, Node: id, Op: op, Message: fmt.Sprintf("node %q (%s): declared shape %v, inferred %s", id, op, s, pyShape(typ.Shape))}
			}
		}
		if d, ok := node["dtype"]; ok && d != string(typ.DType) {
			return nil, &Error{Kind: KindDType, Node: id, Op: op, Message: fmt.Sprintf("node %q (%s): declared dtype %v, inferred %s", id, op, d, typ.DType)}
		}
		t := &Tensor{op: op, inputs: inputs, attrs: norm, typ: typ, id: id, seq: seqCounter.Add(1)}
		built[id] = t
		return t, nil
	}
	ids := make([]string, 0, len(raw))
	for id := range raw {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	all := make([]*Tensor, 0, len(ids))
	for _, id := range ids {
		t, err := build(id)
		if err != nil {
			return nil, err
		}
		all = append(all, t)
	}
	outList, _ := top["outputs"].([]any)
	outs := make([]*Tensor, 0, len(outList))
	for _, o := range outList {
		s, _ := o.(string)
		t := built[s]
		if t == nil {
			return nil, newError(KindGraph, fmt.Sprintf("output %v is not a node", o))
		}
		outs = append(outs, t)
	}
	g, err := NewGraph(outs)
	if err != nil {
		return nil, err
	}
	for _, t := range all { // nodes no output reads
		if g.ids[t] == "" {
			g.nodes = append(g.nodes, t)
			g.ids[t], g.byID[t.id] = t.id, t
		}
	}
	return g, nil
}

func intsOf(l []int64) []int {
	out := make([]int, len(l))
	for i, v := range l {
		out[i] = int(v)
	}
	return out
}
