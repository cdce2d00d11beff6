package triplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxSafeInt is 2**53: integers beyond it are not exact in every SDK (JSON numbers are doubles).
const maxSafeInt = 1 << 53

// CanonicalJSON writes v in the canonical form of proto/README.md (RFC 8785): keys sorted
// by UTF-16 code units, no insignificant whitespace, strings escaped as JSON.stringify does,
// numbers as ECMAScript's Number.prototype.toString. v is built of nil, bool, string, the
// Go integer and float types, []any, []int, []int64, []float64, []string and map[string]any.
func CanonicalJSON(v any) ([]byte, error) {
	var b strings.Builder
	if err := emit(&b, v); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}

// Hash is the lowercase hex SHA-256 of b (a graph's name when b is its canonical JSON).
func Hash(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func emitInt(b *strings.Builder, v int64) error {
	if v > maxSafeInt || v < -maxSafeInt {
		return newError(KindGraph, fmt.Sprintf("integer %d is beyond +-2**53: not every SDK can represent it exactly", v))
	}
	b.WriteString(strconv.FormatInt(v, 10))
	return nil
}

func emit(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int:
		return emitInt(b, int64(x))
	case int64:
		return emitInt(b, x)
	case int32:
		return emitInt(b, int64(x))
	case float32:
		return emit(b, float64(x))
	case float64:
		s, err := ESNumber(x)
		if err != nil {
			return err
		}
		b.WriteString(s)
	case string:
		return emitString(b, x)
	case DType:
		return emitString(b, string(x))
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := emit(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case []int:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := emitInt(b, int64(e)); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case []int64:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := emitInt(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case []float64:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = e
		}
		return emit(b, l)
	case []string:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = e
		}
		return emit(b, l)
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return utf16Less(keys[i], keys[j]) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := emitString(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := emit(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return newError(KindGraph, fmt.Sprintf("cannot encode %T %v in canonical JSON", v, v))
	}
	return nil
}

// utf16Less orders strings by their UTF-16 code units (RFC 8785).
func utf16Less(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

const hexDigits = "0123456789abcdef"

func emitString(b *strings.Builder, s string) error {
	if !utf8.ValidString(s) {
		return newError(KindGraph, "string is not valid UTF-8 (lone surrogate or bad bytes)")
	}
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hexDigits[r>>4])
				b.WriteByte(hexDigits[r&0xf])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return nil
}

// ESNumber formats x as ECMAScript's Number.prototype.toString does: the shortest
// round-trip digits, plain notation for decimal exponents -7 < e < 21, "-0" as "0".
func ESNumber(x float64) (string, error) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "", newError(KindGraph, fmt.Sprintf("%v is not representable in JSON (use a constant node)", x))
	}
	if x == 0 {
		return "0", nil
	}
	sign := ""
	if x < 0 {
		sign = "-"
		x = -x
	}
	// "d.ddde±XX": the shortest digits and the exponent of the first one.
	e := strconv.FormatFloat(x, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		digits = "0"
	}
	p, _ := strconv.Atoi(exp)
	n := p + 1 // the decimal point sits after n digits
	k := len(digits)
	var s string
	switch {
	case k <= n && n <= 21:
		s = digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		s = digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		s = "0." + strings.Repeat("0", -n) + digits
	default:
		es := "+"
		if n-1 < 0 {
			es = "-"
		}
		d := n - 1
		if d < 0 {
			d = -d
		}
		if k == 1 {
			s = digits + "e" + es + strconv.Itoa(d)
		} else {
			s = digits[:1] + "." + digits[1:] + "e" + es + strconv.Itoa(d)
		}
	}
	return sign + s, nil
}
