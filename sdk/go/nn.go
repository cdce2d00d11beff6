package triplane

import "math"

// Training pieces written from ops: every one builds nodes like the op wrappers do (so
// an error names the caller's line), and runs on the cluster with the graph.

// Scalar is a 0-d tensor holding v in dtype d (a constant node for NaN and infinities,
// which JSON attributes cannot hold).
func Scalar(v float64, d DType) *Tensor {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		a, err := NewArray([]float64{v}, []int{}...)
		if err != nil {
			return &Tensor{op: "constant", loc: callerLoc(), err: err}
		}
		return Cast(Constant(encodeBase64(a.Data), []int{}, WithDtype(Float64)), d)
	}
	return Full(v, []int{}, WithDtype(d))
}

// Zeros is a tensor of zeros.
func Zeros(shape []int, d DType) *Tensor { return Full(0, shape, WithDtype(d)) }

// Linear is x @ w + b (b may be nil): w is (in, out), b is (out,).
func Linear(x, w, b *Tensor) *Tensor {
	y := Matmul(x, w)
	if b == nil {
		return y
	}
	return Add(y, b)
}

// SGD is one plain gradient-descent step: w - lr * g.
func SGD(w, g *Tensor, lr float64) *Tensor {
	return Sub(w, Mul(g, Scalar(lr, w.DType())))
}

// AdamConfig holds Adam's hyper-parameters (Kingma & Ba, torch.optim.Adam's defaults
// when zero: lr 1e-3, betas 0.9 and 0.999, eps 1e-8).
type AdamConfig struct {
	LR, Beta1, Beta2, Eps float64
}

func (c AdamConfig) withDefaults() AdamConfig {
	if c.LR == 0 {
		c.LR = 1e-3
	}
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.999
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	return c
}

// Adam is step number step (1 for the first) of Adam for parameter w with gradient g and
// moments m, v (nil: zeros, as before the first step). It returns the new parameter and
// moments:
//
//	m' = b1 m + (1 - b1) g,  v' = b2 v + (1 - b2) g^2
//	w' = w - lr (m' / (1 - b1^step)) / (sqrt(v' / (1 - b2^step)) + eps)
func Adam(w, g, m, v *Tensor, step int, cfg AdamConfig) (w2, m2, v2 *Tensor) {
	c := cfg.withDefaults()
	d := w.DType()
	if m == nil {
		m = Zeros(w.Shape(), d)
	}
	if v == nil {
		v = Zeros(w.Shape(), d)
	}
	s := func(x float64) *Tensor { return Scalar(x, d) }
	m2 = Add(Mul(m, s(c.Beta1)), Mul(g, s(1-c.Beta1)))
	v2 = Add(Mul(v, s(c.Beta2)), Mul(Square(g), s(1-c.Beta2)))
	mhat := Div(m2, s(1-math.Pow(c.Beta1, float64(step))))
	vhat := Div(v2, s(1-math.Pow(c.Beta2, float64(step))))
	w2 = Sub(w, Mul(Div(mhat, Add(Sqrt(vhat), s(c.Eps))), s(c.LR)))
	return w2, m2, v2
}
