package triplane

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The golden graphs of proto/vectors/graphs, built as tests/unit/proto/test_canonical_json.py
// builds them in Python: the same bytes and hash.
func goldenGraphs(t *testing.T) map[string]*Graph {
	t.Helper()
	must := func(g *Graph, err error) *Graph {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	out := map[string]*Graph{}
	{
		x := Input("t-9f2c", []int{4, 3}, WithDtype(Float32))
		w := Input("t-w", []int{3, 2}, WithDtype(Float32))
		bias := Full(0.1, []int{2}, WithDtype(Float32))
		y := Add(Matmul(x, w), bias)
		loss := Sum(Exp(y), WithAxes(-1), WithKeepdims(false))
		out["mlp"] = must(NewGraph([]*Tensor{loss}, "n"))
	}
	{
		x := Input("t", []int{2, 2}, WithDtype(Float64))
		s := x
		for _, v := range []any{1e21, 1e-7, 1e-6, 0.30000000000000004, 5e-324, -math.MaxFloat64, math.Pow(2, 53), -3} {
			s = Mul(s, Full(v, []int{}, WithDtype(Float64)))
		}
		out["numbers"] = must(NewGraph([]*Tensor{s}, "c"))
	}
	{
		f16 := WithDtype(Float16)
		smile := Input("données/é\u00e9\"\\\n\t\u0001\u007f", []int{3}, f16, WithID("\U0001f600"))
		priv := Input("τ-\u2028", []int{3}, f16, WithID("\ue000"))
		a := Input("", []int{3}, f16, WithID("a"))
		z := Sub(Add(smile, priv, WithID("Z")), a, WithID("z"))
		out["unicode"] = must(NewGraph([]*Tensor{z}))
	}
	{
		x := Input("x", []int{2, 3, 4}, WithDtype(Int32))
		tr := Transpose(x, []int{2, 0, 1})
		r := Reshape(tr, []int{4, 6})
		c := Cast(BroadcastTo(r, []int{5, 4, 6}), BFloat16)
		e := Full(true, []int{0}, WithDtype(Bool))
		out["shapes"] = must(NewGraph([]*Tensor{c, e}, "s"))
	}
	return out
}

func TestGoldenGraphsAreByteIdentical(t *testing.T) {
	dir := filepath.Join(protoDir, "vectors", "graphs")
	graphs := goldenGraphs(t)
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) != len(graphs) {
		t.Fatalf("%d golden graph files, %d built here: add the new one to goldenGraphs", len(files), len(graphs))
	}
	for name, g := range graphs {
		want, err := os.ReadFile(filepath.Join(dir, name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		hashText, err := os.ReadFile(filepath.Join(dir, name+".sha256"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := g.CanonicalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: canonical bytes differ\n got %s\nwant %s", name, got, want)
		}
		h, _ := g.Hash()
		if wantHash := strings.Fields(string(hashText))[0]; h != wantHash || Hash(want) != wantHash {
			t.Errorf("%s: hash %s, want %s", name, h, wantHash)
		}
		// the golden file parses back and re-serialises unchanged
		back, err := ParseGraph(want)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		again, err := back.CanonicalJSON()
		if err != nil || !bytes.Equal(again, want) {
			t.Errorf("%s: parsed and re-serialised differs: %s (%v)", name, again, err)
		}
	}
}

func TestCanonicalKeyOrderAndEscapes(t *testing.T) {
	got, err := CanonicalJSON(map[string]any{"\ue000": 1, "\U0001f600": 2, "a": 3, "B": 4, "": 5})
	if err != nil || string(got) != "{\"\":5,\"B\":4,\"a\":3,\"\U0001f600\":2,\"\ue000\":1}" {
		t.Errorf("key order: %s %v", got, err)
	}
	got, _ = CanonicalJSON([]any{"\"\\/\b\f\n\r\t\u0000\u001f\u007f\u2028é"})
	if want := "[\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u001f\u007f\u2028é\"]"; string(got) != want {
		t.Errorf("escapes: %s, want %s", got, want)
	}
	for _, v := range []float64{math.NaN(), math.Inf(1)} {
		if _, err := CanonicalJSON(v); !errors.Is(err, ErrGraph) {
			t.Errorf("%v: %v, want a graph error", v, err)
		}
	}
	if _, err := CanonicalJSON(int64(1) << 54); !errors.Is(err, ErrGraph) {
		t.Errorf("2**54: %v", err)
	}
}

// A wrong shape is an error at the call that made it, naming both shapes and this file's line.
func TestBadShapeIsAnErrorAtTheCall(t *testing.T) {
	x := Input("u-x", []int{16, 5})
	w := Input("u-w", []int{6, 3})
	y := Matmul(x, w) // the line named below
	err := y.Err()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrShape) {
		t.Fatalf("got %v, want a shape *Error", err)
	}
	for _, want := range []string{"(16, 5) @ (6, 3)", "float32[16, 5]", "float32[6, 3]", "golden_test.go:"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q lacks %q", e.Message, want)
		}
	}
	if e.Op != "matmul" || !strings.HasPrefix(e.Loc, "golden_test.go:") {
		t.Errorf("op %q loc %q", e.Op, e.Loc)
	}
	// a later op keeps the first error, and a graph of it refuses to be made
	z := Relu(Add(y, y))
	if z.Err() != err {
		t.Errorf("a later op's error %v is not the first one", z.Err())
	}
	if _, gerr := NewGraph([]*Tensor{z}); gerr != err {
		t.Errorf("NewGraph: %v", gerr)
	}
	// dtype and attribute errors have their own kinds
	if err := Add(x, Cast(x, Float64)).Err(); !errors.Is(err, ErrDType) {
		t.Errorf("mixed dtypes: %v", err)
	}
	if err := Sum(x, WithAxes(0, 0)).Err(); !errors.Is(err, ErrShape) {
		t.Errorf("repeated axes: %v", err)
	}
	if err := Softmax(x, WithAttr("axes", 1)).Err(); !errors.Is(err, ErrAttr) {
		t.Errorf("unknown attribute: %v", err)
	}
	// the node's loc is recorded for the wire document
	ok := Relu(x)
	if !strings.HasPrefix(ok.Loc(), "golden_test.go:") {
		t.Errorf("loc %q", ok.Loc())
	}
}
