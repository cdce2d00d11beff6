package triplane

import "fmt"

// DType is a tensor element type, named as on the wire ("float32").
type DType string

// The dtypes of the graph contract (proto/README.md).
const (
	Float16  DType = "float16"
	BFloat16 DType = "bfloat16"
	Float32  DType = "float32"
	Float64  DType = "float64"
	Int8     DType = "int8"
	Int16    DType = "int16"
	Int32    DType = "int32"
	Int64    DType = "int64"
	Uint8    DType = "uint8"
	Bool     DType = "bool"
)

// DTypes lists every dtype in the order of proto/ops.json.
var DTypes = []DType{Float16, BFloat16, Float32, Float64, Int8, Int16, Int32, Int64, Uint8, Bool}

var itemsizes = map[DType]int{
	Float16: 2, BFloat16: 2, Float32: 4, Float64: 8,
	Int8: 1, Int16: 2, Int32: 4, Int64: 8, Uint8: 1, Bool: 1,
}

// Valid reports whether d names a dtype of the contract.
func (d DType) Valid() bool { _, ok := itemsizes[d]; return ok }

// Size is the number of bytes of one element (0 for an unknown dtype).
func (d DType) Size() int { return itemsizes[d] }

// IsFloat reports whether d is a floating-point dtype.
func (d DType) IsFloat() bool {
	return d == Float16 || d == BFloat16 || d == Float32 || d == Float64
}

// IsInt reports whether d is a (signed or unsigned) integer dtype.
func (d DType) IsInt() bool {
	return d == Int8 || d == Int16 || d == Int32 || d == Int64 || d == Uint8
}

func (d DType) String() string { return string(d) }

func parseDType(s string) (DType, error) {
	d := DType(s)
	if !d.Valid() {
		return "", fmt.Errorf("unknown dtype %q", s)
	}
	return d, nil
}
