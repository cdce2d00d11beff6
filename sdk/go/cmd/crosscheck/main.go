// Command crosscheck runs the cross-language check of PLAN's contract: `crosscheck DIR`
// with TRIPLANE_URL / TRIPLANE_TOKEN set. DIR/spec.json names the inputs (raw
// little-endian C-order files in DIR) and Adam's hyper-parameters; it builds
// logits = relu(x @ w1 + b1) @ w2 + b2, loss = cross_entropy(logits, y), asks the server
// for the gradients of loss with respect to w1 b1 w2 b2, takes one Adam step (step 1,
// zero moments) written from ops on the cluster, and prints one line of JSON:
// {"loss", "logits", "w1", "b1", "w2", "b2"} (the updated parameters, flat).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"triplane"
	"triplane/internal/specdir"
)

// adam is what spec.json holds besides the inputs: Adam's hyper-parameters.
type adam struct {
	LR    float64    `json:"lr"`
	Betas [2]float64 `json:"betas"`
	Eps   float64    `json:"eps"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: crosscheck DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "crosscheck:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	var s adam
	arrays, err := specdir.Read(dir, &s, "x", "y", "w1", "b1", "w2", "b2")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := triplane.Connect(ctx, "", "")
	if err != nil {
		return err
	}
	t := map[string]*triplane.Tensor{}
	for _, name := range []string{"x", "y", "w1", "b1", "w2", "b2"} {
		if t[name], err = c.Upload(ctx, arrays[name]); err != nil {
			return fmt.Errorf("upload %s: %w", name, err)
		}
	}
	params := []*triplane.Tensor{t["w1"], t["b1"], t["w2"], t["b2"]}
	hidden := triplane.Relu(triplane.Linear(t["x"], t["w1"], t["b1"]))
	logits := triplane.Linear(hidden, t["w2"], t["b2"])
	loss := triplane.CrossEntropy(logits, t["y"])
	forward, err := c.Submit(ctx, []*triplane.Tensor{loss, logits}, triplane.WithGrad(loss, params...))
	if err != nil {
		return err
	}
	defer forward.Cancel(context.Background())
	if err := forward.Wait(ctx); err != nil {
		return err
	}
	cfg := triplane.AdamConfig{LR: s.LR, Beta1: s.Betas[0], Beta2: s.Betas[1], Eps: s.Eps}
	updated := make([]*triplane.Tensor, len(params))
	for i, w := range params {
		updated[i], _, _ = triplane.Adam(w, forward.GradRef(w), nil, nil, 1, cfg)
	}
	values, step, err := c.Run(ctx, updated)
	if err != nil {
		return err
	}
	defer step.Cancel(context.Background())
	out := map[string][]float64{}
	for i, name := range []string{"w1", "b1", "w2", "b2"} {
		if out[name], err = values[i].AsFloat64(); err != nil {
			return err
		}
	}
	for name, tensor := range map[string]*triplane.Tensor{"loss": loss, "logits": logits} {
		a, err := forward.Fetch(ctx, tensor)
		if err != nil {
			return err
		}
		if out[name], err = a.AsFloat64(); err != nil {
			return err
		}
	}
	line, err := json.Marshal(map[string]any{
		"loss": out["loss"][0], "logits": out["logits"],
		"w1": out["w1"], "b1": out["b1"], "w2": out["w2"], "b2": out["b2"],
	})
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}
