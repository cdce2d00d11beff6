// Package specdir reads a directory of raw inputs as tests/integration/sdk writes them:
// DIR/spec.json ({"inputs": {NAME: {"shape": [...], "dtype": "float32", "file": "x.bin"}},
// ...}) and the raw little-endian C-order files it names. The cross-language check
// (cmd/crosscheck) and the MLP example (examples/mlp) read their data this way.
//
// It is internal, not part of the SDK's API: the format is the tests' fixture, not a
// triplane file format.
package specdir

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"triplane"
)

// Input is one entry of spec.json's "inputs".
type Input struct {
	Shape []int  `json:"shape"`
	DType string `json:"dtype"`
	File  string `json:"file"`
}

// Read returns the arrays of the inputs names (each must be in spec.json) read from dir.
// When extra is not nil, spec.json is decoded into it as well (for the fields a program
// reads besides "inputs").
func Read(dir string, extra any, names ...string) (map[string]*triplane.Array, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return nil, err
	}
	var spec struct {
		Inputs map[string]Input `json:"inputs"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("spec.json: %w", err)
	}
	if extra != nil {
		if err := json.Unmarshal(raw, extra); err != nil {
			return nil, fmt.Errorf("spec.json: %w", err)
		}
	}
	out := make(map[string]*triplane.Array, len(names))
	for _, name := range names {
		in, ok := spec.Inputs[name]
		if !ok {
			return nil, fmt.Errorf("spec.json has no input %q", name)
		}
		data, err := os.ReadFile(filepath.Join(dir, in.File))
		if err != nil {
			return nil, err
		}
		out[name] = &triplane.Array{Shape: in.Shape, DType: triplane.DType(in.DType), Data: data}
	}
	return out, nil
}
