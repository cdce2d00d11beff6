package triplane

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"triplane/internal/opgen"
)

// The repository's proto/ directory: the op table as data and the golden vectors.
var protoDir = filepath.Join("..", "..", "proto")

func readOpsJSON(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(protoDir, "ops.json"))
	if err != nil {
		t.Fatalf("reading proto/ops.json: %v", err)
	}
	var doc struct {
		Ops map[string]any `json:"ops"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Ops
}

type shapeCase struct {
	Inputs []struct {
		Shape []int  `json:"shape"`
		DType string `json:"dtype"`
	} `json:"inputs"`
	Attrs  json.RawMessage `json:"attrs"`
	Output *struct {
		Shape []int  `json:"shape"`
		DType string `json:"dtype"`
	} `json:"output"`
	Normalised json.RawMessage `json:"normalised_attrs"`
	Error      string          `json:"error"`
}

// Every case of proto/vectors/shapes/<op>.json, for every op: the same output type and
// normalised attributes, or the same error kind, as the Python op table.
func TestShapeVectors(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(protoDir, "vectors", "shapes", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no shape vectors found under %s: %v", protoDir, err)
	}
	total := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Op    string      `json:"op"`
			Cases []shapeCase `json:"cases"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i, c := range doc.Cases {
			total++
			ins := make([]TensorType, len(c.Inputs))
			for k, in := range c.Inputs {
				ins[k] = TensorType{in.Shape, DType(in.DType)}
			}
			av, err := decodeJSON(c.Attrs)
			if err != nil {
				t.Fatal(err)
			}
			attrs, _ := av.(map[string]any)
			got, norm, err := InferType(doc.Op, ins, attrs)
			where := fmt.Sprintf("%s case %d %s", doc.Op, i, c.Attrs)
			if c.Error != "" {
				if err == nil {
					t.Errorf("%s: inferred %s, want a %s error", where, got, c.Error)
				} else if k := kindOf(err); k != c.Error {
					t.Errorf("%s: error kind %s (%v), want %s", where, k, err, c.Error)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: %v, want %v %s", where, err, c.Output.Shape, c.Output.DType)
				continue
			}
			if !sameShape(got.Shape, c.Output.Shape) || string(got.DType) != c.Output.DType {
				t.Errorf("%s: got %s, want %v %s", where, got, c.Output.Shape, c.Output.DType)
			}
			wantNorm, _ := decodeJSON(c.Normalised)
			a, err1 := CanonicalJSON(norm)
			b, err2 := CanonicalJSON(plainValue(wantNorm))
			if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
				t.Errorf("%s: normalised attrs %s, want %s (%v %v)", where, a, b, err1, err2)
			}
		}
	}
	if total < 1000 {
		t.Errorf("only %d shape cases read; the vectors hold over 1000", total)
	}
	t.Logf("%d shape cases of %d ops passed", total, len(files))
}

// A test that fails when an op of proto/ops.json is missing from the SDK: its table
// entry, its inference, its wrapper function, and a shape vector file for it.
func TestOpTableCoverage(t *testing.T) {
	ops := readOpsJSON(t)
	gen, err := os.ReadFile("ops_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	names := make([]string, 0, len(ops))
	for n := range ops {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		var why []string
		if opTable[n] == nil {
			why = append(why, "no table entry")
		}
		if inferFns[n] == nil {
			why = append(why, "no inference")
		}
		if !bytes.Contains(gen, []byte("\nfunc "+opgen.Camel(n)+"(")) {
			why = append(why, "no wrapper "+opgen.Camel(n))
		}
		if _, err := os.Stat(filepath.Join(protoDir, "vectors", "shapes", n+".json")); err != nil {
			why = append(why, "no shape vectors")
		}
		if len(why) > 0 {
			missing = append(missing, n+" ("+strings.Join(why, ", ")+")")
		}
	}
	for n := range opTable {
		if ops[n] == nil {
			missing = append(missing, n+" (in the SDK, not in ops.json: regenerate)")
		}
	}
	t.Logf("op table coverage: %d of %d ops of proto/ops.json have a Go wrapper, inference and shape vectors; missing: %v",
		len(names)-len(missing), len(names), missing)
	if len(missing) > 0 {
		t.Errorf("ops missing from the Go SDK: %s", strings.Join(missing, "; "))
	}
}

// ops_gen.go is what the generator writes from the current proto/ops.json.
func TestGeneratedOpsAreCurrent(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(protoDir, "ops.json"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := opgen.Generate(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("ops_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("ops_gen.go is stale: run `go generate` in sdk/go")
	}
}

func TestNumberVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(protoDir, "vectors", "numbers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []struct {
			Bits      string `json:"bits"`
			Canonical string `json:"canonical"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 20 {
		t.Fatalf("only %d number cases", len(doc.Cases))
	}
	for _, c := range doc.Cases {
		b, err := hex.DecodeString(c.Bits)
		if err != nil || len(b) != 8 {
			t.Fatalf("bad bits %q", c.Bits)
		}
		var u uint64
		for _, x := range b {
			u = u<<8 | uint64(x)
		}
		got, err := ESNumber(math.Float64frombits(u))
		if err != nil || got != c.Canonical {
			t.Errorf("bits %s: got %q (%v), want %q", c.Bits, got, err, c.Canonical)
		}
	}
}
