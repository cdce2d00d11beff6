package triplane

import (
	"strings"
)

// --- reductions (triplane/proto/ops/reduce.py) ---------------------------------------------

func reducedAxes(shape []int, a map[string]any) ([]int, error) {
	axes, err := normaliseAxes(aInts(a, "axes"), a["axes"] == nil, len(shape))
	if err != nil {
		return nil, errf(KindShape, "%s of shape %s", err.(*Error).Message, pyShape(shape))
	}
	return axes, nil
}

func reducedShape(shape []int, a map[string]any) ([]int, error) {
	axes, err := reducedAxes(shape, a)
	if err != nil {
		return nil, err
	}
	out := []int{}
	for i, s := range shape {
		switch {
		case !contains(axes, i):
			out = append(out, s)
		case aBool(a, "keepdims"):
			out = append(out, 1)
		}
	}
	return out, nil
}

func needElements(name string, x TensorType, axes []int) error {
	for _, i := range axes {
		if x.Shape[i] == 0 {
			return errf(KindShape, "%s of an empty set: axes %s of shape %s include a dimension of size 0", name, pyList(axes), pyShape(x.Shape))
		}
	}
	return nil
}

func registerReduce() {
	for _, n := range []string{"sum", "prod", "max", "min", "mean", "logsumexp"} {
		name := n
		nonempty := n == "max" || n == "min"
		inferFns[n] = func(ins []TensorType, a map[string]any) (TensorType, error) {
			x := ins[0]
			s, err := reducedShape(x.Shape, a)
			if err != nil {
				return TensorType{}, err
			}
			if nonempty {
				axes, _ := reducedAxes(x.Shape, a)
				if err := needElements(name, x, axes); err != nil {
					return TensorType{}, err
				}
			}
			return TensorType{s, x.DType}, nil
		}
	}
	inferFns["var"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x := ins[0]
		axes, err := reducedAxes(x.Shape, a)
		if err != nil {
			return TensorType{}, err
		}
		count := 1
		for _, i := range axes {
			count *= x.Shape[i]
		}
		if count-aInt(a, "ddof") <= 0 {
			return TensorType{}, errf(KindShape, "var with ddof=%d over %d element(s) (axes %v of shape %s) has no degrees of freedom",
				aInt(a, "ddof"), count, a["axes"], pyShape(x.Shape))
		}
		s, _ := reducedShape(x.Shape, a)
		return TensorType{s, x.DType}, nil
	}
	for _, n := range []string{"argmax", "argmin"} {
		name := n
		inferFns[n] = func(ins []TensorType, a map[string]any) (TensorType, error) {
			x := ins[0]
			nd := len(x.Shape)
			if a["axis"] == nil {
				all := make([]int, nd)
				for i := range all {
					all[i] = i
				}
				if err := needElements(name, x, all); err != nil {
					return TensorType{}, err
				}
				s := []int{}
				if aBool(a, "keepdims") {
					for range x.Shape {
						s = append(s, 1)
					}
				}
				return TensorType{s, Int64}, nil
			}
			axis := aInt(a, "axis")
			if nd == 0 || !(-nd <= axis && axis < nd) {
				return TensorType{}, errf(KindShape, "axis %d is out of range for shape %s", axis, pyShape(x.Shape))
			}
			ax := pmod(axis, nd)
			if err := needElements(name, x, []int{ax}); err != nil {
				return TensorType{}, err
			}
			s := []int{}
			for i, d := range x.Shape {
				if i != ax {
					s = append(s, d)
				} else if aBool(a, "keepdims") {
					s = append(s, 1)
				}
			}
			return TensorType{s, Int64}, nil
		}
	}
}

// --- shape ops (triplane/proto/ops/shape.py) ---------------------------------------------

func prod(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

func sameDType(ins []TensorType) (DType, error) {
	for _, t := range ins[1:] {
		if t.DType != ins[0].DType {
			names := make([]string, len(ins))
			for i, u := range ins {
				names[i] = string(u.DType)
			}
			return "", errf(KindDType, "inputs have dtypes %s; cast them to one dtype first", strings.Join(names, ", "))
		}
	}
	return ins[0].DType, nil
}

func slicedShape(shape []int, a map[string]any) ([]int, error) {
	starts, stops, steps := aInts(a, "starts"), aInts(a, "stops"), aInts(a, "steps")
	if !(len(starts) == len(stops) && len(stops) == len(steps) && len(steps) == len(shape)) {
		return nil, errf(KindShape, "starts %s, stops %s and steps %s need one entry per axis of %s",
			pyList(starts), pyList(stops), pyList(steps), pyShape(shape))
	}
	out := make([]int, len(shape))
	for i, n := range shape {
		lo, hi, st := starts[i], stops[i], steps[i]
		if !(0 <= lo && lo <= hi && hi <= n && st >= 1) {
			return nil, errf(KindShape, "axis %d: slice %d:%d:%d is not within 0 <= start <= stop <= %d with step >= 1 (shape %s)",
				i, lo, hi, st, n, pyShape(shape))
		}
		out[i] = (hi - lo + st - 1) / st
	}
	return out, nil
}

func checkIndex(idx TensorType, what string) error {
	if !idx.DType.IsInt() {
		return errf(KindDType, "%s indices must be integers, got %s of shape %s", what, idx.DType, pyShape(idx.Shape))
	}
	return nil
}

func registerShape() {
	inferFns["reshape"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, shape := ins[0], aInts(a, "shape")
		if prod(shape) != x.size() {
			return TensorType{}, errf(KindShape, "cannot reshape %s (%d elements) to %s (%d elements)",
				pyShape(x.Shape), x.size(), pyShape(shape), prod(shape))
		}
		return TensorType{shape, x.DType}, nil
	}
	inferFns["transpose"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, perm := ins[0], aInts(a, "perm")
		seen := make([]bool, len(x.Shape))
		ok := len(perm) == len(x.Shape)
		for _, p := range perm {
			ok = ok && p >= 0 && p < len(seen) && !seen[p]
			if ok {
				seen[p] = true
			}
		}
		if !ok {
			return TensorType{}, errf(KindShape, "perm %s is not a permutation of the %d axes of %s", pyList(perm), len(x.Shape), pyShape(x.Shape))
		}
		out := make([]int, len(perm))
		for i, p := range perm {
			out[i] = x.Shape[p]
		}
		return TensorType{out, x.DType}, nil
	}
	inferFns["broadcast_to"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, shape := ins[0], aInts(a, "shape")
		ok := len(shape) >= len(x.Shape)
		for i := 1; ok && i <= len(x.Shape); i++ {
			s, d := x.Shape[len(x.Shape)-i], shape[len(shape)-i]
			ok = s == d || s == 1
		}
		if !ok {
			return TensorType{}, errf(KindShape, "cannot broadcast %s to %s", pyShape(x.Shape), pyShape(shape))
		}
		return TensorType{shape, x.DType}, nil
	}
	inferFns["squeeze"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x := ins[0]
		var drop []int
		if a["axes"] == nil {
			for i, s := range x.Shape {
				if s == 1 {
					drop = append(drop, i)
				}
			}
		} else {
			var err error
			if drop, err = normaliseAxes(aInts(a, "axes"), false, len(x.Shape)); err != nil {
				return TensorType{}, err
			}
			for _, i := range drop {
				if x.Shape[i] != 1 {
					return TensorType{}, errf(KindShape, "cannot squeeze axis %d of shape %s: its size is %d, not 1", i, pyShape(x.Shape), x.Shape[i])
				}
			}
		}
		out := []int{}
		for i, s := range x.Shape {
			if !contains(drop, i) {
				out = append(out, s)
			}
		}
		return TensorType{out, x.DType}, nil
	}
	inferFns["unsqueeze"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x := ins[0]
		if a["axes"] == nil {
			return TensorType{}, errf(KindShape, "unsqueeze needs the positions of the new axes")
		}
		axes := aInts(a, "axes")
		nd := len(x.Shape) + len(axes)
		added, err := normaliseAxes(axes, false, nd)
		if err != nil {
			return TensorType{}, errf(KindShape, "%s (new axes %s for %s)", err.(*Error).Message, pyList(axes), pyShape(x.Shape))
		}
		out, k := make([]int, nd), 0
		for i := range out {
			if contains(added, i) {
				out[i] = 1
			} else {
				out[i] = x.Shape[k]
				k++
			}
		}
		return TensorType{out, x.DType}, nil
	}
	inferFns["concat"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		d, err := sameDType(ins)
		if err != nil {
			return TensorType{}, err
		}
		first := ins[0]
		if len(first.Shape) == 0 {
			return TensorType{}, errf(KindShape, "cannot concatenate 0-d tensors (stack them instead)")
		}
		ax, err := normaliseAxis(aInt(a, "axis"), len(first.Shape), "axis")
		if err != nil {
			return TensorType{}, err
		}
		out := append([]int{}, first.Shape...)
		out[ax] = 0
		for _, t := range ins {
			ok := len(t.Shape) == len(first.Shape)
			for i := 0; ok && i < len(t.Shape); i++ {
				ok = i == ax || t.Shape[i] == first.Shape[i]
			}
			if !ok {
				parts := make([]string, len(ins))
				for i, u := range ins {
					parts[i] = pyShape(u.Shape)
				}
				return TensorType{}, errf(KindShape, "shapes %s differ outside axis %d", strings.Join(parts, ", "), ax)
			}
			out[ax] += t.Shape[ax]
		}
		return TensorType{out, d}, nil
	}
	inferFns["stack"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		d, err := sameDType(ins)
		if err != nil {
			return TensorType{}, err
		}
		first := ins[0]
		for _, t := range ins {
			if !sameShape(t.Shape, first.Shape) {
				parts := make([]string, len(ins))
				for i, u := range ins {
					parts[i] = pyShape(u.Shape)
				}
				return TensorType{}, errf(KindShape, "cannot stack tensors of different shapes: %s", strings.Join(parts, ", "))
			}
		}
		ax, err := normaliseAxis(aInt(a, "axis"), len(first.Shape)+1, "axis")
		if err != nil {
			return TensorType{}, err
		}
		out := append(append(append([]int{}, first.Shape[:ax]...), len(ins)), first.Shape[ax:]...)
		return TensorType{out, d}, nil
	}
	inferFns["slice"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		s, err := slicedShape(ins[0].Shape, a)
		return TensorType{s, ins[0].DType}, err
	}
	inferFns["unslice"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		g, shape := ins[0], aInts(a, "shape")
		want, err := slicedShape(shape, a)
		if err != nil {
			return TensorType{}, err
		}
		if !sameShape(want, g.Shape) {
			return TensorType{}, errf(KindShape, "a slice of %s has shape %s, but the values have shape %s", pyShape(shape), pyShape(want), pyShape(g.Shape))
		}
		return TensorType{shape, g.DType}, nil
	}
	inferFns["gather"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x, idx := ins[0], ins[1]
		if err := checkIndex(idx, "gather"); err != nil {
			return TensorType{}, err
		}
		if len(x.Shape) == 0 {
			return TensorType{}, errf(KindShape, "cannot gather from a 0-d tensor (index shape %s)", pyShape(idx.Shape))
		}
		ax, err := normaliseAxis(aInt(a, "axis"), len(x.Shape), "axis")
		if err != nil {
			return TensorType{}, err
		}
		out := append(append(append([]int{}, x.Shape[:ax]...), idx.Shape...), x.Shape[ax+1:]...)
		return TensorType{out, x.DType}, nil
	}
	inferFns["scatter_add"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		g, idx := ins[0], ins[1]
		if err := checkIndex(idx, "scatter_add"); err != nil {
			return TensorType{}, err
		}
		ax := aInt(a, "axis")
		if !(0 <= ax && ax <= len(g.Shape)-len(idx.Shape)) || !sameShape(g.Shape[ax:ax+len(idx.Shape)], idx.Shape) {
			return TensorType{}, errf(KindShape, "values of shape %s do not hold index shape %s at axis %d", pyShape(g.Shape), pyShape(idx.Shape), ax)
		}
		out := append(append(append([]int{}, g.Shape[:ax]...), aInt(a, "size")), g.Shape[ax+len(idx.Shape):]...)
		return TensorType{out, g.DType}, nil
	}
	inferFns["pad"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		x := ins[0]
		pads, _ := a["pads"].([]any)
		if len(pads) != len(x.Shape) {
			return TensorType{}, errf(KindShape, "pads %v need one [before, after] pair per axis of %s", showValue(a["pads"]), pyShape(x.Shape))
		}
		out := make([]int, len(x.Shape))
		for i, p := range pads {
			pair := p.([]any)
			out[i] = x.Shape[i] + int(pair[0].(int64)) + int(pair[1].(int64))
		}
		return TensorType{out, x.DType}, nil
	}
	inferFns["flip"] = func(ins []TensorType, a map[string]any) (TensorType, error) {
		if _, err := normaliseAxes(aInts(a, "axes"), a["axes"] == nil, len(ins[0].Shape)); err != nil {
			return TensorType{}, err
		}
		return ins[0], nil
	}
}

// --- fused (triplane/proto/ops/fused.py) --------------------------------------------------

func isReduction(op string) bool {
	switch op {
	case "sum", "prod", "max", "min", "mean":
		return true
	}
	return false
}

func programTypes(ins []TensorType, a map[string]any) ([]TensorType, error) {
	program, ok := a["program"].([]any)
	if !ok || len(program) == 0 {
		return nil, errf(KindAttr, "attribute 'program' must be a non-empty list of steps, got %s", showValue(a["program"]))
	}
	types := append([]TensorType{}, ins...)
	for k, raw := range program {
		step, ok := raw.([]any)
		var op string
		var args []any
		var attrs map[string]any
		if ok && len(step) == 3 {
			op, ok = step[0].(string)
			if ok {
				args, ok = step[1].([]any)
			}
			if ok {
				attrs, ok = step[2].(map[string]any)
			}
		} else {
			ok = false
		}
		if !ok {
			return nil, errf(KindAttr, "program step %d must be [op, [args], {attrs}], got %s", k, showValue(raw))
		}
		spec := opTable[op]
		if spec == nil {
			return nil, errf(KindUnknownOp, "unknown op %q", op)
		}
		last := k == len(program)-1
		if !spec.Elementwise && op != "full" {
			if !(last && isReduction(op)) {
				return nil, errf(KindAttr, "program step %d: %s is not elementwise (only the last step may be a reduction with a combine: sum, prod, max, min, mean)", k, op)
			}
			n, isInt := asInt(firstOr(args))
			if len(args) != 1 || !isInt || int(n) != len(types)-1 || k == 0 {
				return nil, errf(KindAttr, "program step %d: the reduction %s must read the step before it", k, op)
			}
		}
		stepIns := make([]TensorType, 0, len(args))
		for _, arg := range args {
			n, isInt := asInt(arg)
			if !isInt || n < 0 || int(n) >= len(types) {
				return nil, errf(KindAttr, "program step %d: argument %s names no earlier value", k, showValue(arg))
			}
			stepIns = append(stepIns, types[n])
		}
		norm, err := spec.normaliseAttrs(attrs)
		if err != nil {
			return nil, err
		}
		t, err := spec.check(stepIns, norm)
		if err != nil {
			return nil, err
		}
		types = append(types, t)
	}
	return types[len(ins):], nil
}

func firstOr(l []any) any {
	if len(l) == 0 {
		return nil
	}
	return l[0]
}

func inferFused(ins []TensorType, a map[string]any) (TensorType, error) {
	steps, err := programTypes(ins, a)
	if err != nil {
		return TensorType{}, err
	}
	program := a["program"].([]any)
	lastOp, _ := program[len(program)-1].([]any)[0].(string)
	reduced := isReduction(lastOp)
	body := steps[len(steps)-1]
	check := steps[:len(steps)-1]
	if reduced && len(steps) >= 2 {
		body = steps[len(steps)-2]
		check = steps[:len(steps)-2]
	}
	for k, t := range check {
		if len(t.Shape) != 0 && !sameShape(t.Shape, body.Shape) {
			return TensorType{}, errf(KindShape, "program step %d has shape %s, not the body's %s", k, pyShape(t.Shape), pyShape(body.Shape))
		}
	}
	return steps[len(steps)-1], nil
}
