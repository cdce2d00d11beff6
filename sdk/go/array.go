package triplane

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
)

// Array is host data: little-endian bytes in row-major (C) order, with a shape and a
// dtype. It is what an upload sends and a fetch returns.
type Array struct {
	Shape []int
	DType DType
	Data  []byte
}

// Element is a Go type an Array can be made of and read as.
type Element interface {
	~float32 | ~float64 | ~int64 | ~int32 | ~int16 | ~int8 | ~uint8 | ~bool
}

func dtypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int64:
		return Int64
	case int32:
		return Int32
	case int16:
		return Int16
	case int8:
		return Int8
	case uint8:
		return Uint8
	case bool:
		return Bool
	}
	panic(fmt.Sprintf("triplane: no dtype for %T", z))
}

// NewArray is data (row-major) as an Array of the given shape (none: a 1-d array of
// len(data)); the dtype follows the element type ([]float32: float32, []int64: int64, ...).
func NewArray[T Element](data []T, shape ...int) (*Array, error) {
	if shape == nil {
		shape = []int{len(data)}
	}
	n := 1
	for _, d := range shape {
		if d < 0 {
			return nil, newError(KindShape, fmt.Sprintf("negative dimension in shape %v", shape))
		}
		n *= d
	}
	if n != len(data) {
		return nil, newError(KindShape, fmt.Sprintf("%d elements do not fill shape %s (%d elements)", len(data), pyShape(shape), n))
	}
	d := dtypeOf[T]()
	out := make([]byte, n*d.Size())
	for i, v := range data {
		switch x := any(v).(type) {
		case float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		case float64:
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(x))
		case int64:
			binary.LittleEndian.PutUint64(out[8*i:], uint64(x))
		case int32:
			binary.LittleEndian.PutUint32(out[4*i:], uint32(x))
		case int16:
			binary.LittleEndian.PutUint16(out[2*i:], uint16(x))
		case int8:
			out[i] = byte(x)
		case uint8:
			out[i] = x
		case bool:
			if x {
				out[i] = 1
			}
		}
	}
	return &Array{Shape: append([]int{}, shape...), DType: d, Data: out}, nil
}

// Values reads the array as []T; T must be the array's dtype (Float32 as float32, ...).
func Values[T Element](a *Array) ([]T, error) {
	want := dtypeOf[T]()
	if a.DType != want {
		return nil, newError(KindDType, fmt.Sprintf("the array holds %s, not %s", a.DType, want))
	}
	size := want.Size()
	if len(a.Data)%size != 0 {
		return nil, newError(KindRequest, fmt.Sprintf("%d bytes are not whole %s elements", len(a.Data), want))
	}
	out := make([]T, len(a.Data)/size)
	for i := range out {
		var v any
		switch want {
		case Float32:
			v = math.Float32frombits(binary.LittleEndian.Uint32(a.Data[4*i:]))
		case Float64:
			v = math.Float64frombits(binary.LittleEndian.Uint64(a.Data[8*i:]))
		case Int64:
			v = int64(binary.LittleEndian.Uint64(a.Data[8*i:]))
		case Int32:
			v = int32(binary.LittleEndian.Uint32(a.Data[4*i:]))
		case Int16:
			v = int16(binary.LittleEndian.Uint16(a.Data[2*i:]))
		case Int8:
			v = int8(a.Data[i])
		case Uint8:
			v = a.Data[i]
		case Bool:
			v = a.Data[i] != 0
		}
		out[i] = v.(T)
	}
	return out, nil
}

// Float32 reads a float32 array.
func (a *Array) Float32() ([]float32, error) { return Values[float32](a) }

// Float64 reads a float64 array.
func (a *Array) Float64() ([]float64, error) { return Values[float64](a) }

// Int64 reads an int64 array.
func (a *Array) Int64() ([]int64, error) { return Values[int64](a) }

// AsFloat64 reads any floating-point or integer array as float64 values (float16 and
// bfloat16 included), for printing and comparing.
func (a *Array) AsFloat64() ([]float64, error) {
	size := a.DType.Size()
	if size == 0 || len(a.Data)%size != 0 {
		return nil, newError(KindDType, fmt.Sprintf("cannot read %d bytes of %q", len(a.Data), a.DType))
	}
	out := make([]float64, len(a.Data)/size)
	for i := range out {
		b := a.Data[size*i:]
		switch a.DType {
		case Float16:
			out[i] = halfToFloat(binary.LittleEndian.Uint16(b))
		case BFloat16:
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16))
		case Float32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
		case Float64:
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b))
		case Int64:
			out[i] = float64(int64(binary.LittleEndian.Uint64(b)))
		case Int32:
			out[i] = float64(int32(binary.LittleEndian.Uint32(b)))
		case Int16:
			out[i] = float64(int16(binary.LittleEndian.Uint16(b)))
		case Int8:
			out[i] = float64(int8(b[0]))
		case Uint8, Bool:
			out[i] = float64(b[0])
		}
	}
	return out, nil
}

func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * frac * math.Pow(2, -24)
	case 31:
		if frac == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * (1 + frac/1024) * math.Pow(2, float64(exp-15))
}

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
