package triplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// attrSpec is one attribute's schema, from proto/ops.json.
type attrSpec struct {
	Name     string
	Kind     string // int float bool str ints floats axes shape dtype any
	Required bool
	Default  string // JSON text of the default (when not required)
	Nullable bool
	Choices  []string
}

// opSpec is one op of the table, from proto/ops.json (ops_gen.go holds them all).
type opSpec struct {
	Name           string
	Group          string
	Arity          int // -1: one or more
	Attrs          []attrSpec
	DTypes         []DType
	Result         string // input:<k>, attr:dtype or fixed:<dtype>
	Differentiable bool
	Internal       bool
	Elementwise    bool
	Doc            string
}

// OpNames lists every op of the table the SDK was generated from, sorted.
func OpNames() []string {
	names := make([]string, 0, len(opTable))
	for n := range opTable {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var kindText = map[string]string{
	"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
	"ints": "a list of integers", "floats": "a list of numbers",
	"axes": "an axis or a list of axes (or null for all)", "shape": "a list of non-negative integers",
	"dtype": "a dtype name", "any": "a value",
}

type bad struct{}

// asInt reads an integer from a Go value or a JSON number (not a float, not a bool).
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case json.Number:
		s := string(x)
		if strings.ContainsAny(s, ".eE") {
			return 0, false
		}
		n, err := x.Int64()
		return n, err == nil
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	if n, ok := asInt(v); ok {
		return float64(n), true
	}
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	}
	return 0, false
}

func asList(v any) ([]any, bool) {
	switch x := v.(type) {
	case []any:
		return x, true
	case []int:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out, true
	case []int64:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out, true
	case []float64:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out, true
	}
	return nil, false
}

func asInts(v any) ([]int64, bool) {
	l, ok := asList(v)
	if !ok {
		return nil, false
	}
	out := make([]int64, len(l))
	for i, e := range l {
		n, ok := asInt(e)
		if !ok {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// plainValue turns JSON numbers into int64/float64 (recursively) for an "any" attribute.
func plainValue(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, ok := asInt(x); ok {
			return n
		}
		f, _ := x.Float64()
		return f
	case int:
		return int64(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plainValue(e)
		}
		return out
	case [][]int:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plainValue(toAnyInts(e))
		}
		return out
	case []int:
		return plainValue(toAnyInts(x))
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = plainValue(e)
		}
		return out
	}
	return v
}

func toAnyInts(x []int) []any {
	out := make([]any, len(x))
	for i, e := range x {
		out[i] = int64(e)
	}
	return out
}

func coerce(kind string, v any) any {
	switch kind {
	case "int":
		if n, ok := asInt(v); ok {
			return n
		}
	case "float":
		if f, ok := asFloat(v); ok {
			return f
		}
	case "bool":
		if b, ok := v.(bool); ok {
			return b
		}
	case "str":
		if s, ok := v.(string); ok {
			return s
		}
	case "ints", "shape":
		if l, ok := asInts(v); ok {
			if kind == "shape" {
				for _, d := range l {
					if d < 0 {
						return bad{}
					}
				}
			}
			return l
		}
	case "floats":
		if l, ok := asList(v); ok {
			out := make([]float64, len(l))
			for i, e := range l {
				f, ok := asFloat(e)
				if !ok {
					return bad{}
				}
				out[i] = f
			}
			return out
		}
	case "axes":
		if n, ok := asInt(v); ok {
			return []int64{n}
		}
		if l, ok := asInts(v); ok {
			return l
		}
	case "dtype":
		switch x := v.(type) {
		case DType:
			if x.Valid() {
				return x
			}
		case string:
			if DType(x).Valid() {
				return DType(x)
			}
		}
	case "any":
		return plainValue(v)
	}
	return bad{}
}

func (a attrSpec) normalise(op string, v any) (any, error) {
	if v == nil && (a.Nullable || a.Kind == "axes" || a.Kind == "any") {
		return nil, nil
	}
	c := coerce(a.Kind, v)
	if _, isBad := c.(bad); isBad {
		return nil, newError(KindAttr, fmt.Sprintf("attribute %q must be %s, got %s", a.Name, kindText[a.Kind], showValue(v)))
	}
	if a.Choices != nil {
		s, _ := c.(string)
		found := false
		for _, ch := range a.Choices {
			if ch == s {
				found = true
			}
		}
		if !found {
			return nil, newError(KindAttr, fmt.Sprintf("attribute %q must be one of %q, got %s", a.Name, a.Choices, showValue(v)))
		}
	}
	if check := attrChecks[op+"."+a.Name]; check != nil {
		if why := check(c); why != "" {
			return nil, newError(KindAttr, fmt.Sprintf("attribute %q=%s: %s", a.Name, showValue(v), why))
		}
	}
	return c, nil
}

func showValue(v any) string {
	b, err := CanonicalJSON(plainValue(v))
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// normaliseAttrs applies the op's schema: defaults filled, types coerced, unknown names
// rejected (as triplane.proto.opdef.OpDef.normalise_attrs).
func (s *opSpec) normaliseAttrs(attrs map[string]any) (map[string]any, error) {
	var unknown []string
	for k := range attrs {
		if s.attr(k) == nil {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		known := make([]string, 0, len(s.Attrs))
		for _, a := range s.Attrs {
			known = append(known, a.Name)
		}
		return nil, newError(KindAttr, fmt.Sprintf("unknown attribute(s) %q (known: %q)", unknown, known))
	}
	out := make(map[string]any, len(s.Attrs))
	for _, a := range s.Attrs {
		if v, ok := attrs[a.Name]; ok {
			n, err := a.normalise(s.Name, v)
			if err != nil {
				return nil, err
			}
			out[a.Name] = n
		} else if a.Required {
			return nil, newError(KindAttr, fmt.Sprintf("missing required attribute %q", a.Name))
		} else {
			out[a.Name] = a.defaultValue()
		}
	}
	return out, nil
}

func (s *opSpec) attr(name string) *attrSpec {
	for i := range s.Attrs {
		if s.Attrs[i].Name == name {
			return &s.Attrs[i]
		}
	}
	return nil
}

func (a attrSpec) defaultValue() any {
	v, err := decodeJSON([]byte(a.Default))
	if err != nil {
		panic(fmt.Sprintf("ops_gen.go: bad default for %s: %v", a.Name, err))
	}
	if v == nil {
		return nil
	}
	c := coerce(a.Kind, v)
	if _, isBad := c.(bad); isBad {
		panic(fmt.Sprintf("ops_gen.go: default %s of %s is not %s", a.Default, a.Name, a.Kind))
	}
	return c
}

// decodeJSON reads one JSON value keeping numbers as json.Number (an int literal stays an int).
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// --- value checks the schema cannot say (the op table's `check=` functions) -----------

func finite(v any) string {
	if f, _ := v.(float64); math.IsNaN(f) || math.IsInf(f, 0) {
		return "must be finite"
	}
	return ""
}

func intAtLeast(lo int64) func(any) string {
	return func(v any) string {
		if n, _ := v.(int64); n < lo {
			return fmt.Sprintf("must be >= %d", lo)
		}
		return ""
	}
}

func jsonSafe(v any) string {
	if n, _ := v.(int64); n < 0 || n >= maxSafeInt {
		return "must be in [0, 2**53)"
	}
	return ""
}

func pairAtLeast(lo int64) func(any) string {
	return func(v any) string {
		l, _ := v.([]int64)
		ok := len(l) == 2
		for _, x := range l {
			ok = ok && x >= lo
		}
		if !ok {
			return fmt.Sprintf("must be 2 integers >= %d", lo)
		}
		return ""
	}
}

func isNumber(v any) bool {
	switch v.(type) {
	case bool, int64, float64:
		return true
	}
	return false
}

func unitInterval(v any) string {
	if f, _ := v.(float64); !(f >= 0 && f < 1) {
		return "must be in [0, 1)"
	}
	return ""
}

func positive(v any) string {
	if f, _ := v.(float64); !(f > 0) {
		return "must be > 0"
	}
	return ""
}

var attrChecks = map[string]func(any) string{}

func init() {
	set := func(f func(any) string, keys ...string) {
		for _, k := range keys {
			attrChecks[k] = f
		}
	}
	set(func(v any) string {
		if !isNumber(v) {
			return "must be a number or a boolean"
		}
		return finite(v)
	}, "full.value")
	set(func(v any) string {
		if !isNumber(v) {
			return "must be a number or a boolean"
		}
		return ""
	}, "pad.value")
	set(func(v any) string {
		l, ok := v.([]any)
		for _, p := range l {
			pair, isList := p.([]any)
			ok = ok && isList && len(pair) == 2
			for _, q := range pair {
				n, isInt := q.(int64)
				ok = ok && isInt && n >= 0
			}
		}
		if !ok {
			return "must be a list of [before, after] pairs of non-negative integers"
		}
		return ""
	}, "pad.pads")
	set(finite, "arange.start", "arange.stop", "uniform.low", "uniform.high", "normal.mean")
	set(func(v any) string {
		if w := finite(v); w != "" {
			return w
		}
		if v.(float64) == 0 {
			return "must not be zero"
		}
		return ""
	}, "arange.step")
	set(func(v any) string {
		if w := finite(v); w != "" {
			return w
		}
		if v.(float64) < 0 {
			return "must be >= 0"
		}
		return ""
	}, "normal.std")
	set(intAtLeast(0), "eye.n", "eye.m", "var.ddof", "scatter_add.size")
	set(intAtLeast(1), "embedding_grad.num_embeddings", "one_hot.num_classes")
	for _, op := range []string{"uniform", "normal"} {
		set(func(v any) string {
			if !v.(DType).IsFloat() {
				return "random ops make floating-point tensors"
			}
			return ""
		}, op+".dtype")
		set(jsonSafe, op+".seed", op+".offset")
	}
	set(jsonSafe, "dropout.seed")
	set(func(v any) string {
		if unitInterval(v) != "" {
			return "the drop probability must be in [0, 1)"
		}
		return ""
	}, "dropout.p")
	set(unitInterval, "cross_entropy.label_smoothing", "cross_entropy_grad.label_smoothing")
	set(positive, "layer_norm.eps", "batch_norm.eps")
	for _, op := range []string{"conv2d", "conv2d_grad_input", "conv2d_grad_weight"} {
		set(pairAtLeast(1), op+".stride", op+".dilation")
		set(pairAtLeast(0), op+".padding")
		set(intAtLeast(1), op+".groups")
	}
	for _, op := range []string{"max_pool2d", "avg_pool2d", "max_pool2d_grad", "avg_pool2d_grad"} {
		set(pairAtLeast(1), op+".kernel", op+".stride")
		set(pairAtLeast(0), op+".padding")
	}
}
