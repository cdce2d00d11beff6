// Command mlp trains a two-layer perceptron on the digits data set against a triplane
// cluster and prints the loss of each step. The data is a directory holding spec.json
// ({"inputs": {"x": {"shape": [N, 64], "dtype": "float32", "file": "x.bin"}, "y": {...
// "int64" ...}}}) and the raw little-endian files it names (tests/integration/sdk writes
// one from scikit-learn's digits). The cluster is TRIPLANE_URL / TRIPLANE_TOKEN, else
// the one `triplane up` recorded.
//
//	go run ./examples/mlp -data DIR -steps 10
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"time"

	"triplane"
	"triplane/internal/specdir"
)

func main() {
	data := flag.String("data", "", "directory with spec.json, x.bin and y.bin")
	steps := flag.Int("steps", 10, "Adam steps to take")
	hidden := flag.Int("hidden", 32, "hidden units")
	lr := flag.Float64("lr", 0.01, "Adam learning rate")
	flag.Parse()
	if *data == "" {
		fmt.Fprintln(os.Stderr, "mlp: -data DIR is required")
		os.Exit(2)
	}
	if err := train(*data, *steps, *hidden, *lr); err != nil {
		fmt.Fprintln(os.Stderr, "mlp:", err)
		os.Exit(1)
	}
}

// glorot is a (fanIn, fanOut) matrix of uniform values in +-sqrt(6 / (fanIn + fanOut)).
func glorot(r *rand.Rand, fanIn, fanOut int) *triplane.Array {
	limit := math.Sqrt(6 / float64(fanIn+fanOut))
	w := make([]float32, fanIn*fanOut)
	for i := range w {
		w[i] = float32((r.Float64()*2 - 1) * limit)
	}
	a, _ := triplane.NewArray(w, fanIn, fanOut)
	return a
}

func train(dir string, steps, hidden int, lr float64) error {
	arrays, err := specdir.Read(dir, nil, "x", "y")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := triplane.Connect(ctx, "", "")
	if err != nil {
		return err
	}
	x, err := c.Upload(ctx, arrays["x"])
	if err != nil {
		return err
	}
	y, err := c.Upload(ctx, arrays["y"])
	if err != nil {
		return err
	}
	features, classes := x.Shape()[1], 10
	r := rand.New(rand.NewSource(0))
	params := make([]*triplane.Tensor, 4)
	for i, a := range []*triplane.Array{
		glorot(r, features, hidden), zeros(hidden), glorot(r, hidden, classes), zeros(classes),
	} {
		if params[i], err = c.Upload(ctx, a); err != nil {
			return err
		}
	}
	moments := make([][2]*triplane.Tensor, len(params)) // nil: zeros before the first step
	var previous *triplane.Job
	for step := 1; step <= steps; step++ {
		w1, b1, w2, b2 := params[0], params[1], params[2], params[3]
		logits := triplane.Linear(triplane.Relu(triplane.Linear(x, w1, b1)), w2, b2)
		loss := triplane.CrossEntropy(logits, y)
		values, forward, err := c.Run(ctx, []*triplane.Tensor{loss}, triplane.WithGrad(loss, params...))
		if err != nil {
			return err
		}
		l, err := values[0].Float32()
		if err != nil {
			return err
		}
		fmt.Printf("step %d loss %.6f\n", step, l[0])
		// the Adam step, on the cluster, reading the gradients by ref
		var fetch []*triplane.Tensor
		for i, w := range params {
			w2, m2, v2 := triplane.Adam(w, forward.GradRef(w), moments[i][0], moments[i][1], step, triplane.AdamConfig{LR: lr})
			fetch = append(fetch, w2, m2, v2)
		}
		update, err := c.Submit(ctx, fetch)
		if err != nil {
			return err
		}
		if err := update.Wait(ctx); err != nil {
			return err
		}
		for i := range params {
			params[i] = update.Ref(fetch[3*i])
			moments[i] = [2]*triplane.Tensor{update.Ref(fetch[3*i+1]), update.Ref(fetch[3*i+2])}
		}
		// the jobs whose results nothing reads any more
		forward.Cancel(ctx)
		if previous != nil {
			previous.Cancel(ctx)
		}
		previous = update
	}
	if previous != nil {
		previous.Cancel(ctx)
	}
	return nil
}

func zeros(n int) *triplane.Array {
	a, _ := triplane.NewArray(make([]float32, n), n)
	return a
}
