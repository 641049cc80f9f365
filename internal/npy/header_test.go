package npy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

func TestParseHeader_Valid(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		dtype memmap.DType
		shape []int
		width int
	}{
		{"numpy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }                    \n", memmap.Float32, []int{3, 4}, 1},
		{"scalar", "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", memmap.Float64, []int{}, 1},
		{"one dim", "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }", memmap.Uint8, []int{5}, 1},
		{"key order", "{'shape': (2,), 'fortran_order': False, 'descr': '>i2'}", memmap.Int16, []int{2}, 2},
		{"double quotes", `{"descr": ">f8", "fortran_order": False, "shape": (1, 2)}`, memmap.Float64, []int{1, 2}, 8},
		{"whitespace", "\t{ 'descr' :'=i4' ,\n'fortran_order':False,'shape':( 7 , 8 , ) } \r\n", memmap.Int32, []int{7, 8}, 1},
		{"python 2 longs", "{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 4L), }", memmap.Int64, []int{3, 4}, 1},
		{"python 2 unicode", "{u'descr': u'<u2', 'fortran_order': False, 'shape': (1,)}", memmap.Uint16, []int{1}, 1},
		{"bool", "{'descr': '|b1', 'fortran_order': False, 'shape': (0,)}", memmap.Bool, []int{0}, 1},
		{"native bar", "{'descr': '|i4', 'fortran_order': False, 'shape': (1,)}", memmap.Int32, []int{1}, 1},
		{"big-endian byte", "{'descr': '>i1', 'fortran_order': False, 'shape': (1,)}", memmap.Int8, []int{1}, 1},
		{"big-endian complex", "{'descr': '>c16', 'fortran_order': False, 'shape': (1,)}", memmap.Complex128, []int{1}, 8},
		{"big-endian c8", "{'descr': '>c8', 'fortran_order': False, 'shape': (1,)}", memmap.Complex64, []int{1}, 4},
		{"big-endian u4", "{'descr': '>u4', 'fortran_order': False, 'shape': (1,)}", memmap.Uint32, []int{1}, 4},
		{"half", "{'descr': '<f2', 'fortran_order': False, 'shape': (1,)}", memmap.Float16, []int{1}, 1},
		{"fortran vector", "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 5, 1)}", memmap.Float32, []int{1, 5, 1}, 1},
		{"fortran scalar", "{'descr': '<f4', 'fortran_order': True, 'shape': ()}", memmap.Float32, []int{}, 1},
		{"huge empty", "{'descr': '<f8', 'fortran_order': False, 'shape': (9223372036854775807, 0)}", memmap.Float64, []int{1<<63 - 1, 0}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, width, err := parseHeader(tt.text)
			if err != nil {
				t.Fatalf("parseHeader(%q): %v", tt.text, err)
			}
			if h.DType != tt.dtype || !slices.Equal(h.Shape, tt.shape) || h.Shape == nil || width != tt.width {
				t.Errorf("parseHeader(%q) = %v %#v width %d, want %v %v width %d", tt.text, h.DType, h.Shape, width, tt.dtype, tt.shape, tt.width)
			}
		})
	}
}

func TestParseHeader_Errors(t *testing.T) {
	const ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}"
	tests := []struct {
		name string
		text string
		want error
		msg  string
	}{
		{"empty", "", ErrFormat, "unexpected end"},
		{"not a dict", "('<f4', False, (3,))", ErrFormat, "not a dict"},
		{"unclosed", ok[:len(ok)-1], ErrFormat, "unexpected end"},
		{"trailing", ok + " x", ErrFormat, "after the literal"},
		{"missing comma", "{'descr': '<f4' 'fortran_order': False, 'shape': (3,)}", ErrFormat, "missing ','"},
		{"missing colon", "{'descr' '<f4'}", ErrFormat, "missing ':'"},
		{"missing key", "{'descr': '<f4', 'shape': (3,)}", ErrFormat, "no key 'fortran_order'"},
		{"extra key", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", ErrFormat, "unexpected key 'x'"},
		{"int key", "{1: 2}", ErrFormat, "unexpected key 1"},
		{"duplicate key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", ErrFormat, "'descr' twice"},
		{"shape not tuple", "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", ErrFormat, "'shape' is 3"},
		{"shape list", "{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", ErrFormat, "'shape' is [3]"},
		{"shape bool", "{'descr': '<f4', 'fortran_order': False, 'shape': (True,)}", ErrFormat, "non-integer dimension True"},
		{"negative dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", ErrFormat, "unexpected '-'"},
		{"float dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}", ErrFormat, "missing ','"},
		{"leading zero", "{'descr': '<f4', 'fortran_order': False, 'shape': (03,)}", ErrFormat, "leading zero"},
		{"huge dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775808,)}", ErrFormat, "too large"},
		{"overflow", "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 2)}", ErrFormat, "overflows"},
		{"65 dims", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + strings.Repeat("1,", 65) + ")}", ErrFormat, "at most 64"},
		{"fortran int", "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}", ErrFormat, "'fortran_order' is 0"},
		{"None", "{'descr': '<f4', 'fortran_order': None, 'shape': (3,)}", ErrFormat, `unexpected name "None"`},
		{"unterminated", "{'descr': '<f4}", ErrFormat, "unterminated string"},
		{"escaped quote", `{'descr': '<f4\'}`, ErrFormat, "unterminated string"},
		{"deep", strings.Repeat("[", 40) + strings.Repeat("]", 40), ErrFormat, "nested deeper than 32"},
		{"empty tuple comma", "(,)", ErrFormat, "unexpected ','"},
		{"structured", "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (3,)}", ErrUnsupported, "structured dtype [('x', '<f4')]"},
		{"string", "{'descr': '|S5', 'fortran_order': False, 'shape': (3,)}", ErrUnsupported, `dtype "|S5"`},
		{"long double", "{'descr': '<f16', 'fortran_order': False, 'shape': (3,)}", ErrUnsupported, `dtype "<f16"`},
		{"no byte order", "{'descr': 'f4', 'fortran_order': False, 'shape': (3,)}", ErrUnsupported, `dtype "f4"`},
		{"bad byte order", "{'descr': '!u1', 'fortran_order': False, 'shape': (3,)}", ErrUnsupported, `dtype "!u1"`},
		{"escaped descr", `{'descr': '<f\4', 'fortran_order': False, 'shape': (3,)}`, ErrUnsupported, `dtype "<f\\4"`},
		{"fortran matrix", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 1, 3)}", ErrUnsupported, "[2 1 3] in Fortran order"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseHeader(tt.text)
			if !errors.Is(err, tt.want) {
				t.Fatalf("parseHeader(%q) error = %v, want %v", tt.text, err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("parseHeader(%q) error %q does not mention %q", tt.text, err, tt.msg)
			}
		})
	}
}

func TestParseLiteral_Source(t *testing.T) {
	long := "[" + strings.Repeat("'abcdefgh', ", 20) + "]"
	_, _, err := parseHeader("{'descr': " + long + ", 'fortran_order': False, 'shape': ()}")
	if !errors.Is(err, ErrUnsupported) || !strings.HasSuffix(err.Error(), "...") || len(err.Error()) > 120 {
		t.Errorf("error = %q, want ErrUnsupported with the descr abbreviated", err)
	}
}

func TestParseLiteral_Depth(t *testing.T) {
	for _, tt := range []struct {
		depth int
		ok    bool
	}{{maxDepth, true}, {maxDepth + 1, false}} {
		_, err := parseLiteral(strings.Repeat("(", tt.depth) + strings.Repeat(")", tt.depth))
		if (err == nil) != tt.ok {
			t.Errorf("%d nested tuples: error = %v, want ok = %v", tt.depth, err, tt.ok)
		}
	}
}
