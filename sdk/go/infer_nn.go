package triplane

// Inference of the neural-network ops (triplane/proto/ops/nn.py).

func needFloat(t TensorType, what string) error {
	if !t.DType.IsFloat() {
		return errf(KindDType, "%s must be floating point, got %s of shape %s", what, t.DType, pyShape(t.Shape))
	}
	return nil
}

func needIndex(t TensorType, what string) error {
	if !t.DType.IsInt() {
		return errf(KindDType, "%s must be integer indices, got %s of shape %s", what, t.DType, pyShape(t.Shape))
	}
	return nil
}

func checkCE(logits, labels TensorType) error {
	if err := needFloat(logits, "logits"); err != nil {
		return err
	}
	if err := needIndex(labels, "labels"); err != nil {
		return err
	}
	if len(logits.Shape) == 0 {
		return errf(KindShape, "logits must have a class axis: (C,), (N, C) or (N, C, d...), got shape ()")
	}
	want := []int{}
	if len(logits.Shape) > 1 {
		want = append([]int{logits.Shape[0]}, logits.Shape[2:]...)
	}
	if !sameShape(labels.Shape, want) {
		return errf(KindShape, "labels of shape %s do not fit logits of shape %s (expected labels of shape %s: logits without the class axis 1)",
			pyShape(labels.Shape), pyShape(logits.Shape), pyShape(want))
	}
	return nil
}

func lossShape(a map[string]any, full []int) []int {
	if aStr(a, "reduction") == "none" {
		return full
	}
	return []int{}
}

// convOutHW: output height and width of a window op.
func convOutHW(hw, khw []int, a map[string]any, what string) ([2]int, error) {
	stride, padding := aInts(a, "stride"), aInts(a, "padding")
	dilation := []int{1, 1}
	if _, ok := a["dilation"]; ok {
		dilation = aInts(a, "dilation")
	}
	var out [2]int
	for i := 0; i < 2; i++ {
		span := dilation[i]*(khw[i]-1) + 1
		if hw[i]+2*padding[i] < span {
			return out, errf(KindShape, "%s: the window (%d after dilation) is larger than the padded input (%d + 2*%d)", what, span, hw[i], padding[i])
		}
		out[i] = (hw[i]+2*padding[i]-span)/stride[i] + 1
	}
	return out, nil
}

func inferConv2d(x, w TensorType, a map[string]any) (TensorType, error) {
	if x.DType != w.DType {
		return TensorType{}, errf(KindDType, "input and weight have dtypes %s and %s; cast them to one dtype", x.DType, w.DType)
	}
	if len(x.Shape) != 4 || len(w.Shape) != 4 {
		return TensorType{}, errf(KindShape, "needs input (N, C, H, W) and weight (O, C/groups, kH, kW), got %s and %s", pyShape(x.Shape), pyShape(w.Shape))
	}
	g := aInt(a, "groups")
	what := "input " + pyShape(x.Shape) + ", weight " + pyShape(w.Shape)
	if x.Shape[1]%g != 0 || w.Shape[0]%g != 0 {
		return TensorType{}, errf(KindShape, "groups=%d must divide the input channels and the output channels (%s)", g, what)
	}
	if w.Shape[1]*g != x.Shape[1] {
		return TensorType{}, errf(KindShape, "weight expects %d input channels (%d per group x %d groups), the input has %d (%s)",
			w.Shape[1]*g, w.Shape[1], g, x.Shape[1], what)
	}
	hw, err := convOutHW(x.Shape[2:], w.Shape[2:], a, what)
	if err != nil {
		return TensorType{}, err
	}
	return TensorType{[]int{x.Shape[0], w.Shape[0], hw[0], hw[1]}, x.DType}, nil
}

func inferPool(x TensorType, a map[string]any) (TensorType, error) {
	if len(x.Shape) != 4 {
		return TensorType{}, errf(KindShape, "needs an input (N, C, H, W), got shape %s", pyShape(x.Shape))
	}
	b := map[string]any{"kernel": a["kernel"], "stride": a["stride"], "padding": a["padding"]}
	if b["stride"] == nil {
		b["stride"] = a["kernel"]
	}
	kernel, padding := aInts(b, "kernel"), aInts(b, "padding")
	for i := range padding {
		if 2*padding[i] > kernel[i] {
			return TensorType{}, errf(KindAttr, "padding %s must be at most half the kernel %s", pyList(padding), pyList(kernel))
		}
	}
	hw, err := convOutHW(x.Shape[2:], kernel, b, "input "+pyShape(x.Shape)+", kernel "+pyList(kernel))
	if err != nil {
		return TensorType{}, err
	}
	return TensorType{[]int{x.Shape[0], x.Shape[1], hw[0], hw[1]}, x.DType}, nil
}

func registerNN() {
	softmax := func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, ax := ins[0], aInt(a, "axis")
		m := len(x.Shape)
		if m < 1 {
			m = 1
		}
		if !(-m <= ax && ax < m) {
			return TensorType{}, errf(KindAttr, "attribute 'axis'=%d is out of range for a tensor of shape %s", ax, pyShape(x.Shape))
		}
		return x, nil
	}
	inferFns["softmax"] = softmax
	inferFns["log_softmax"] = softmax
	inferFns["cross_entropy"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		if err := checkCE(ins[0], ins[1]); err != nil {
			return TensorType{}, err
		}
		return TensorType{lossShape(a, ins[1].Shape), ins[0].DType}, nil
	}
	inferFns["cross_entropy_grad"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		logits, labels, g := ins[0], ins[1], ins[2]
		if err := checkCE(logits, labels); err != nil {
			return TensorType{}, err
		}
		want := lossShape(a, labels.Shape)
		if !sameShape(g.Shape, want) || g.DType != logits.DType {
			return TensorType{}, errf(KindShape, "incoming gradient %s does not match the loss %s%s", g, logits.DType, pyList(want))
		}
		return logits, nil
	}
	inferFns["mse_loss"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, y := ins[0], ins[1]
		if x.DType != y.DType {
			return TensorType{}, errf(KindDType, "operands have dtypes %s and %s; cast them to one dtype first", x.DType, y.DType)
		}
		s, err := broadcastShapes(x.Shape, y.Shape)
		if err != nil {
			return TensorType{}, err
		}
		return TensorType{lossShape(a, s), x.DType}, nil
	}
	inferFns["conv2d"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		return inferConv2d(ins[0], ins[1], a)
	}
	inferFns["conv2d_grad_input"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		g, w := ins[0], ins[1]
		x := TensorType{aInts(a, "input_shape"), g.DType}
		out, err := inferConv2d(x, w, a)
		if err != nil {
			return TensorType{}, err
		}
		if !sameShape(g.Shape, out.Shape) {
			return TensorType{}, errf(KindShape, "gradient of shape %s does not match conv2d output %s", pyShape(g.Shape), pyShape(out.Shape))
		}
		return x, nil
	}
	inferFns["conv2d_grad_weight"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, g := ins[0], ins[1]
		w := TensorType{aInts(a, "weight_shape"), x.DType}
		out, err := inferConv2d(x, w, a)
		if err != nil {
			return TensorType{}, err
		}
		if !sameShape(g.Shape, out.Shape) {
			return TensorType{}, errf(KindShape, "gradient of shape %s does not match conv2d output %s", pyShape(g.Shape), pyShape(out.Shape))
		}
		return w, nil
	}
	pool := func(ins []TensorType, a map[string]any) (TensorType, error) { return inferPool(ins[0], a) }
	inferFns["max_pool2d"] = pool
	inferFns["avg_pool2d"] = pool
	inferFns["max_pool2d_grad"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, g := ins[0], ins[1]
		out, err := inferPool(x, a)
		if err != nil {
			return TensorType{}, err
		}
		if !sameShape(g.Shape, out.Shape) || g.DType != x.DType {
			return TensorType{}, errf(KindShape, "gradient %s does not match max_pool2d output %s", g, out)
		}
		return x, nil
	}
	inferFns["avg_pool2d_grad"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		g := ins[0]
		x := TensorType{aInts(a, "input_shape"), g.DType}
		out, err := inferPool(x, a)
		if err != nil {
			return TensorType{}, err
		}
		if !sameShape(g.Shape, out.Shape) {
			return TensorType{}, errf(KindShape, "gradient of shape %s does not match avg_pool2d output %s", pyShape(g.Shape), pyShape(out.Shape))
		}
		return x, nil
	}
	inferFns["embedding"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		w, idx := ins[0], ins[1]
		if err := needFloat(w, "weight"); err != nil {
			return TensorType{}, err
		}
		if err := needIndex(idx, "indices"); err != nil {
			return TensorType{}, err
		}
		if len(w.Shape) != 2 {
			return TensorType{}, errf(KindShape, "weight must be (num_embeddings, dim), got shape %s", pyShape(w.Shape))
		}
		return TensorType{append(append([]int{}, idx.Shape...), w.Shape[1]), w.DType}, nil
	}
	inferFns["embedding_grad"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		idx, g := ins[0], ins[1]
		if err := needIndex(idx, "indices"); err != nil {
			return TensorType{}, err
		}
		if err := needFloat(g, "gradient"); err != nil {
			return TensorType{}, err
		}
		if len(g.Shape) != len(idx.Shape)+1 || !sameShape(g.Shape[:len(g.Shape)-1], idx.Shape) {
			return TensorType{}, errf(KindShape, "gradient of shape %s does not fit indices of shape %s", pyShape(g.Shape), pyShape(idx.Shape))
		}
		return TensorType{[]int{aInt(a, "num_embeddings"), g.Shape[len(g.Shape)-1]}, g.DType}, nil
	}
	inferFns["one_hot"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		if err := needIndex(ins[0], "indices"); err != nil {
			return TensorType{}, err
		}
		return TensorType{append(append([]int{}, ins[0].Shape...), aInt(a, "num_classes")), aDType(a, "dtype")}, nil
	}
	inferFns["dropout"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		if err := checkRegion(ins[0].Shape, a); err != nil {
			return TensorType{}, err
		}
		return ins[0], nil
	}
	inferFns["layer_norm"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, w, b := ins[0], ins[1], ins[2]
		k, nd := aInt(a, "normalized_ndim"), len(x.Shape)
		if !(1 <= k && k <= nd) {
			return TensorType{}, errf(KindAttr, "attribute 'normalized_ndim'=%d must be in [1, %d] for input %s", k, nd, pyShape(x.Shape))
		}
		want := x.Shape[nd-k:]
		if !sameShape(w.Shape, want) || !sameShape(b.Shape, want) {
			return TensorType{}, errf(KindShape, "weight %s and bias %s must have the normalised shape %s (the last %d axes of input %s)",
				pyShape(w.Shape), pyShape(b.Shape), pyShape(want), k, pyShape(x.Shape))
		}
		if x.DType != w.DType || w.DType != b.DType {
			return TensorType{}, errf(KindDType, "input, weight and bias have dtypes %s, %s, %s; cast them to one dtype", x.DType, w.DType, b.DType)
		}
		return x, nil
	}
	inferFns["batch_norm"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x := ins[0]
		if len(x.Shape) < 2 {
			return TensorType{}, errf(KindShape, "needs an input (N, C, ...), got shape %s", pyShape(x.Shape))
		}
		c := x.Shape[1]
		for i, name := range []string{"weight", "bias", "running_mean", "running_var"} {
			t := ins[i+1]
			if !sameShape(t.Shape, []int{c}) {
				return TensorType{}, errf(KindShape, "%s has shape %s; input %s has %d channels, so (%d,)", name, pyShape(t.Shape), pyShape(x.Shape), c, c)
			}
			if t.DType != x.DType {
				return TensorType{}, errf(KindDType, "%s has dtype %s, the input %s; cast them to one dtype", name, t.DType, x.DType)
			}
		}
		return x, nil
	}
}
