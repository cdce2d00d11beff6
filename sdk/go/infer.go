package triplane

import (
	"encoding/base64"
	"fmt"
	"math"
	"sort"
	"strings"
)

// TensorType is a shape and a dtype: what the op table infers for a node.
type TensorType struct {
	Shape []int
	DType DType
}

func (t TensorType) size() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// String is the type as the server's messages write it: float32[16, 5].
func (t TensorType) String() string {
	parts := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		parts[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s[%s]", t.DType, strings.Join(parts, ", "))
}

// pyShape writes a shape as the Python op table does: (2, 3), (3,), ().
func pyShape(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	if len(s) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func pyList[T int | int64](s []T) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func errf(kind, format string, args ...any) *Error {
	return newError(kind, fmt.Sprintf(format, args...))
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// InferType is the op table's inference for one op application: the attributes are
// normalised (defaults filled) and the output type computed, or an *Error of kind
// shape, dtype, attr, graph, limit or unknown_op, as triplane.proto.opdef.OpDef.check.
func InferType(op string, ins []TensorType, attrs map[string]any) (TensorType, map[string]any, error) {
	spec := opTable[op]
	if spec == nil {
		return TensorType{}, nil, errf(KindUnknownOp, "unknown op %q", op)
	}
	norm, err := spec.normaliseAttrs(attrs)
	if err != nil {
		return TensorType{}, nil, err
	}
	t, err := spec.check(ins, norm)
	return t, norm, err
}

func (s *opSpec) check(ins []TensorType, a map[string]any) (TensorType, error) {
	if s.Arity < 0 {
		if len(ins) < 1 {
			return TensorType{}, errf(KindGraph, "needs at least one input")
		}
	} else if len(ins) != s.Arity {
		return TensorType{}, errf(KindGraph, "takes %d input(s), got %d", s.Arity, len(ins))
	}
	for i, t := range ins {
		ok := false
		for _, d := range s.DTypes {
			ok = ok || d == t.DType
		}
		if !ok {
			acc := make([]string, len(s.DTypes))
			for j, d := range s.DTypes {
				acc[j] = string(d)
			}
			sort.Strings(acc)
			return TensorType{}, errf(KindDType, "input %d has dtype %s, which %s does not accept (accepted: %s)",
				i, t.DType, s.Name, strings.Join(acc, ", "))
		}
	}
	f := inferFns[s.Name]
	if f == nil {
		return TensorType{}, errf(KindUnknownOp, "op %q has no inference in the Go SDK", s.Name)
	}
	out, err := f(ins, a)
	if err != nil {
		return TensorType{}, err
	}
	return TensorType{Shape: append([]int{}, out.Shape...), DType: out.DType}, nil
}

// --- attribute access (values are normalised: int64, float64, bool, string, []int64, DType, nil)

func aInt(a map[string]any, k string) int { n, _ := a[k].(int64); return int(n) }

func aInts(a map[string]any, k string) []int {
	l, _ := a[k].([]int64)
	out := make([]int, len(l))
	for i, v := range l {
		out[i] = int(v)
	}
	return out
}

func aFloat(a map[string]any, k string) float64 { f, _ := a[k].(float64); return f }
func aBool(a map[string]any, k string) bool     { b, _ := a[k].(bool); return b }
func aStr(a map[string]any, k string) string    { s, _ := a[k].(string); return s }
func aDType(a map[string]any, k string) DType   { d, _ := a[k].(DType); return d }

// --- shared helpers (triplane.proto.opdef) ----------------------------------------------

func pmod(a, n int) int { return ((a % n) + n) % n }

func normaliseAxis(axis, ndim int, what string) (int, error) {
	m := ndim
	if m < 1 {
		m = 1
	}
	if !(-m <= axis && axis < m) {
		return 0, errf(KindShape, "%s %d is out of range for a %d-d tensor", what, axis, ndim)
	}
	return pmod(axis, m), nil
}

// normaliseAxes: nil axes means all; sorted, non-negative; repeated axes are an error.
func normaliseAxes(axes []int, isNil bool, ndim int) ([]int, error) {
	if isNil {
		out := make([]int, ndim)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	if ndim == 0 {
		return []int{}, nil
	}
	out := make([]int, 0, len(axes))
	for _, a := range axes {
		n, err := normaliseAxis(a, ndim, "axis")
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	sort.Ints(out)
	for i := 1; i < len(out); i++ {
		if out[i] == out[i-1] {
			return nil, errf(KindShape, "repeated axis in %s", pyList(axes))
		}
	}
	return out, nil
}

func broadcastShapes(shapes ...[]int) ([]int, error) {
	nd := 0
	for _, s := range shapes {
		if len(s) > nd {
			nd = len(s)
		}
	}
	out := make([]int, nd)
	for i := 0; i < nd; i++ {
		dim := 1
		for _, s := range shapes {
			d := 1
			if j := i - nd + len(s); j >= 0 {
				d = s[j]
			}
			if d != 1 {
				if dim != 1 && dim != d {
					parts := make([]string, len(shapes))
					for k, x := range shapes {
						parts[k] = pyShape(x)
					}
					return nil, errf(KindShape, "shapes %s do not broadcast", strings.Join(parts, " and "))
				}
				dim = d
			}
		}
		out[i] = dim
	}
	return out, nil
}

func contains(xs []int, v int) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

type inferFn func(ins []TensorType, a map[string]any) (TensorType, error)

var inferFns = map[string]inferFn{}

func same(ins []TensorType, a map[string]any) (TensorType, error) { return ins[0], nil }

func binaryInfer(predicate bool) inferFn {
	return func(ins []TensorType, a map[string]any) (TensorType, error) {
		if ins[0].DType != ins[1].DType {
			return TensorType{}, errf(KindDType, "operands have dtypes %s and %s; cast them to one dtype first", ins[0].DType, ins[1].DType)
		}
		s, err := broadcastShapes(ins[0].Shape, ins[1].Shape)
		if err != nil {
			return TensorType{}, err
		}
		d := ins[0].DType
		if predicate {
			d = Bool
		}
		return TensorType{s, d}, nil
	}
}

func init() {
	for _, n := range []string{"neg", "abs", "sign", "square", "relu", "floor", "ceil", "exp", "log", "sqrt",
		"rsqrt", "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid", "silu", "gelu", "erf", "logical_not"} {
		inferFns[n] = same
	}
	for _, n := range []string{"add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum",
		"minimum", "logical_and", "logical_or"} {
		inferFns[n] = binaryInfer(false)
	}
	for _, n := range []string{"eq", "ne", "lt", "le", "gt", "ge"} {
		inferFns[n] = binaryInfer(true)
	}
	inferFns["where"] = inferWhere
	inferFns["cast"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		return TensorType{ins[0].Shape, aDType(a, "dtype")}, nil
	}
	inferFns["input"] = declared
	inferFns["full"] = declared
	inferFns["constant"] = inferConstant
	inferFns["arange"] = inferArange
	inferFns["eye"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		n := aInt(a, "n")
		m := n
		if a["m"] != nil {
			m = aInt(a, "m")
		}
		return TensorType{[]int{n, m}, aDType(a, "dtype")}, nil
	}
	inferFns["uniform"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		if !(aFloat(a, "low") <= aFloat(a, "high")) {
			return TensorType{}, errf(KindAttr, "uniform needs low <= high, got low=%v high=%v", a["low"], a["high"])
		}
		return inferRandom(ins, a)
	}
	inferFns["normal"] = inferRandom
	inferFns["matmul"] = inferMatmul
	registerReduce()
	registerShape()
	registerNN()
	inferFns["fused"] = inferFused
}

func declared(ins []TensorType, a map[string]any) (TensorType, error) {
	return TensorType{aInts(a, "shape"), aDType(a, "dtype")}, nil
}

func inferWhere(ins []TensorType, a map[string]any) (TensorType, error) {
	c, x, y := ins[0], ins[1], ins[2]
	if c.DType != Bool {
		return TensorType{}, errf(KindDType, "the condition has dtype %s; it must be bool (compare it with something first)", c.DType)
	}
	if x.DType != y.DType {
		return TensorType{}, errf(KindDType, "the two branches have dtypes %s and %s; cast them to one dtype first", x.DType, y.DType)
	}
	s, err := broadcastShapes(c.Shape, x.Shape, y.Shape)
	if err != nil {
		return TensorType{}, err
	}
	return TensorType{s, x.DType}, nil
}

func inferConstant(ins []TensorType, a map[string]any) (TensorType, error) {
	t, _ := declared(ins, a)
	raw, err := base64.StdEncoding.Strict().DecodeString(aStr(a, "data"))
	if err != nil {
		return TensorType{}, errf(KindAttr, "attribute 'data' is not valid base64")
	}
	if need := t.size() * t.DType.Size(); len(raw) != need {
		return TensorType{}, errf(KindAttr, "attribute 'data' holds %d bytes; %s needs %d", len(raw), t, need)
	}
	return t, nil
}

const maxRange = 1 << 48

func inferArange(ins []TensorType, a map[string]any) (TensorType, error) {
	start, stop, step := aFloat(a, "start"), aFloat(a, "stop"), aFloat(a, "step")
	n := math.Ceil((stop - start) / step)
	if n > maxRange {
		return TensorType{}, errf(KindLimit, "arange(%v, %v, %v) has %v elements, more than %d", start, stop, step, n, maxRange)
	}
	if n < 0 {
		n = 0
	}
	d := aDType(a, "dtype")
	if d == Bool {
		return TensorType{}, errf(KindAttr, "arange cannot make bool tensors (dtype 'bool')")
	}
	return TensorType{[]int{int(n)}, d}, nil
}

// checkRegion: full_shape and start both null, or a box of full_shape of size shape.
func checkRegion(shape []int, a map[string]any) error {
	if a["full_shape"] == nil && a["start"] == nil {
		return nil
	}
	if a["full_shape"] == nil || a["start"] == nil {
		return errf(KindAttr, "attributes 'full_shape' and 'start' go together (both null, or both set)")
	}
	full, start := aInts(a, "full_shape"), aInts(a, "start")
	ok := len(full) == len(start) && len(start) == len(shape)
	for i := 0; ok && i < len(shape); i++ {
		ok = start[i] >= 0 && start[i]+shape[i] <= full[i]
	}
	if !ok {
		return errf(KindShape, "a region of shape %s at start %s does not fit full_shape %s", pyShape(shape), pyList(start), pyList(full))
	}
	return nil
}

func inferRandom(ins []TensorType, a map[string]any) (TensorType, error) {
	if err := checkRegion(aInts(a, "shape"), a); err != nil {
		return TensorType{}, err
	}
	return declared(ins, a)
}

func inferMatmul(ins []TensorType, a map[string]any) (TensorType, error) {
	x, y := ins[0], ins[1]
	if x.DType != y.DType {
		return TensorType{}, errf(KindDType, "operands have dtypes %s and %s; cast them to one dtype first", x.DType, y.DType)
	}
	if len(x.Shape) == 0 || len(y.Shape) == 0 {
		return TensorType{}, errf(KindShape, "matmul needs operands of at least 1 dimension, got %s @ %s", pyShape(x.Shape), pyShape(y.Shape))
	}
	xs, ys := x.Shape, y.Shape
	if len(xs) == 1 {
		xs = []int{1, xs[0]}
	}
	if len(ys) == 1 {
		ys = []int{ys[0], 1}
	}
	if xs[len(xs)-1] != ys[len(ys)-2] {
		return TensorType{}, errf(KindShape, "inner dimensions differ: %s @ %s (%d != %d)",
			pyShape(x.Shape), pyShape(y.Shape), xs[len(xs)-1], ys[len(ys)-2])
	}
	batch, err := broadcastShapes(xs[:len(xs)-2], ys[:len(ys)-2])
	if err != nil {
		return TensorType{}, errf(KindShape, "batch dimensions do not broadcast: %s @ %s", pyShape(x.Shape), pyShape(y.Shape))
	}
	out := append(append([]int{}, batch...), xs[len(xs)-2], ys[len(ys)-1])
	if len(x.Shape) == 1 {
		out = append(out[:len(out)-2], out[len(out)-1])
	}
	if len(y.Shape) == 1 {
		out = out[:len(out)-1]
	}
	return TensorType{out, x.DType}, nil
}
