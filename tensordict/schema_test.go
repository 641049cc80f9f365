package tensordict

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/memmap"
)

// rowSchema is sample's row schema.
var rowSchema = RowSchema{
	{Key: []string{"obs"}, DType: memmap.Float32, Shape: []int{2}},
	{Key: []string{"action"}, DType: memmap.Int64, Shape: []int{}},
	{Key: []string{"next", "done"}, DType: memmap.Bool, Shape: []int{}},
}

func TestRowSchema_Validate(t *testing.T) {
	f := func(dt memmap.DType, shape []int, key ...string) RowField {
		return RowField{Key: key, DType: dt, Shape: shape}
	}
	for _, tc := range []struct {
		name   string
		s      RowSchema
		errHas string // "" if valid
		cause  error
	}{
		{"sample", rowSchema, "", nil},
		{"nil shape is a scalar row", RowSchema{f(memmap.Int8, nil, "a")}, "", nil},
		{"zero dimension", RowSchema{f(memmap.Int8, []int{0, 5}, "a")}, "", nil},
		{"siblings in a nested dict", RowSchema{f(memmap.Int8, nil, "a", "b"), f(memmap.Int8, nil, "a", "c")}, "", nil},
		{"no fields", RowSchema{}, "no fields", nil},
		{"nil", nil, "no fields", nil},
		{"no key", RowSchema{f(memmap.Int8, nil)}, "empty key", nil},
		{"empty key element", RowSchema{f(memmap.Int8, nil, "a", "")}, "empty key", nil},
		{"twice", RowSchema{f(memmap.Int8, nil, "a"), f(memmap.Int16, nil, "a")}, "twice", nil},
		{"tensor and dict", RowSchema{f(memmap.Int8, nil, "a", "b"), f(memmap.Int8, nil, "a")}, "inside field [a]", nil},
		{"invalid dtype", RowSchema{f(memmap.Invalid, nil, "a")}, "field [a]", memmap.ErrDType},
		{"negative dimension", RowSchema{f(memmap.Int8, []int{2, -1}, "a")}, "negative", memmap.ErrShape},
		{"row too large", RowSchema{f(memmap.Int64, []int{math.MaxInt / 4}, "a")}, "overflows", memmap.ErrShape},
		{"rows too large together", RowSchema{f(memmap.Int8, []int{math.MaxInt / 2}, "a"), f(memmap.Int8, []int{math.MaxInt / 2}, "b"), f(memmap.Int8, []int{2}, "c")}, "overflow", memmap.ErrShape},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate()
			if tc.errHas == "" {
				if err != nil {
					t.Fatalf("Validate(%v) = %v", tc.s, err)
				}
				return
			}
			if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("Validate(%v) = %v; want ErrSchema saying %q", tc.s, err, tc.errHas)
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Fatalf("Validate(%v) = %v; want it to wrap %v", tc.s, err, tc.cause)
			}
		})
	}
}

func TestRowSchema_Bytes(t *testing.T) {
	if got := rowSchema.RowBytes(); got != 2*4+8+1 {
		t.Errorf("RowBytes = %d, want 17", got)
	}
	if got, err := rowSchema.NumBytes(10); got != 170 || err != nil {
		t.Errorf("NumBytes(10) = %d, %v; want 170", got, err)
	}
	if got, err := rowSchema.NumBytes(2, 5); got != 170 || err != nil {
		t.Errorf("NumBytes(2, 5) = %d, %v; want 170", got, err)
	}
	if got, err := rowSchema.NumBytes(); got != 17 || err != nil {
		t.Errorf("NumBytes() = %d, %v; want 17", got, err)
	}
	if _, err := rowSchema.NumBytes(math.MaxInt / 4); !errors.Is(err, memmap.ErrShape) || !errors.Is(err, ErrSchema) {
		t.Errorf("NumBytes(MaxInt/4) = %v; want ErrSchema and ErrShape", err)
	}
	bad := RowSchema{{Key: []string{"a"}, DType: memmap.Invalid}}
	if got := bad.RowBytes(); got != -1 {
		t.Errorf("RowBytes of an invalid schema = %d, want -1", got)
	}
}

// TestRowSchema_BatchesRoundTrip checks that Fields, Zeros and Create make
// batches whose RowSchema is the schema, and whose full Schema is Fields.
func TestRowSchema_BatchesRoundTrip(t *testing.T) {
	fields := rowSchema.Fields(3)
	want := []Field{
		{Key: []string{"obs"}, DType: memmap.Float32, Shape: []int{3, 2}},
		{Key: []string{"action"}, DType: memmap.Int64, Shape: []int{3}},
		{Key: []string{"next", "done"}, DType: memmap.Bool, Shape: []int{3}},
	}
	if !reflect.DeepEqual(fields, want) {
		t.Fatalf("Fields(3) = %v, want %v", fields, want)
	}
	fields[0].Key[0], fields[0].Shape[1] = "changed", 99
	if rowSchema[0].Key[0] != "obs" || rowSchema[0].Shape[0] != 2 {
		t.Fatalf("Fields shares memory with the schema: %v", rowSchema)
	}

	zeros, err := rowSchema.Zeros(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := rowSchema.Match(zeros.RowSchema()); err != nil {
		t.Errorf("Zeros(3).RowSchema: %v", err)
	}
	if !reflect.DeepEqual(zeros.Schema(), want) {
		t.Errorf("Zeros(3).Schema() = %v, want %v", zeros.Schema(), want)
	}

	prefix := filepath.Join(t.TempDir(), "p")
	td, err := rowSchema.Create(prefix, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	if !slices.Equal(td.BatchSize(), []int{4}) || !reflect.DeepEqual(td.RowSchema(), rowSchema) {
		t.Errorf("Create(4): batch %v, row schema %v", td.BatchSize(), td.RowSchema())
	}
	if got := sample(t, 5).RowSchema(); !reflect.DeepEqual(got, rowSchema) {
		t.Errorf("sample's RowSchema = %v, want %v", got, rowSchema)
	}

	nested := mustNew(t, 2, 3)
	if err := nested.Set("x", must[*Tensor](t)(Zeros(memmap.Uint8, 2, 3, 5))); err != nil {
		t.Fatal(err)
	}
	if got, want := nested.RowSchema(), (RowSchema{{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{5}}}); !reflect.DeepEqual(got, want) {
		t.Errorf("RowSchema of a [2 3] batch = %v, want %v", got, want)
	}
}

func TestRowSchema_InvalidCreatesNothing(t *testing.T) {
	bad := RowSchema{{Key: []string{"a"}, DType: memmap.Int8}, {Key: []string{"a"}, DType: memmap.Int8}}
	prefix := filepath.Join(t.TempDir(), "p")
	if _, err := bad.Create(prefix, 2); !errors.Is(err, ErrSchema) {
		t.Fatalf("Create of a schema with a key twice: %v, want ErrSchema", err)
	}
	if _, err := os.Stat(prefix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused Create left %s: %v", prefix, err)
	}
	if _, err := bad.Zeros(2); !errors.Is(err, ErrSchema) {
		t.Fatalf("Zeros of a schema with a key twice: %v, want ErrSchema", err)
	}
}

func TestRowSchema_Match(t *testing.T) {
	reordered := RowSchema{rowSchema[2], rowSchema[0], rowSchema[1]}
	for _, tc := range []struct {
		name   string
		got    RowSchema
		errHas string
	}{
		{"same", rowSchema.Clone(), ""},
		{"another order", reordered, ""},
		{"other dtype", RowSchema{{Key: []string{"obs"}, DType: memmap.Float64, Shape: []int{2}}, rowSchema[1], rowSchema[2]}, "dtype torch.float64, want torch.float32"},
		{"other shape", RowSchema{{Key: []string{"obs"}, DType: memmap.Float32, Shape: []int{3}}, rowSchema[1], rowSchema[2]}, "shape [3] per row, want [2]"},
		{"unknown key", RowSchema{{Key: []string{"x"}, DType: memmap.Float32}}, "field [x] is not in the schema"},
		{"missing field", rowSchema[:2], "2 fields, want 3"},
		{"none", nil, "0 fields, want 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := rowSchema.Match(tc.got)
			if tc.errHas == "" {
				if err != nil {
					t.Fatalf("Match: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("Match = %v; want ErrSchema saying %q", err, tc.errHas)
			}
		})
	}
}

func TestRowSchema_Clone(t *testing.T) {
	if RowSchema(nil).Clone() != nil {
		t.Error("Clone of nil is not nil")
	}
	c := rowSchema.Clone()
	if !reflect.DeepEqual(c, rowSchema) {
		t.Fatalf("Clone = %v", c)
	}
	c[0].Key[0], c[0].Shape[0] = "x", 7
	if rowSchema[0].Key[0] != "obs" || rowSchema[0].Shape[0] != 2 {
		t.Fatalf("Clone shares memory: %v", rowSchema)
	}
	if got, want := rowSchema.String(), "[obs] torch.float32[2], [action] torch.int64[], [next done] torch.bool[]"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// TestRowField_JSON pins the JSON form replay.json stores: the dtype is
// its torch name, a nil shape null and an empty one [].
func TestRowField_JSON(t *testing.T) {
	s := RowSchema{
		{Key: []string{"next", "obs"}, DType: memmap.BFloat16, Shape: []int{2, 3}},
		{Key: []string{"a"}, DType: memmap.Int64},
		{Key: []string{"r"}, DType: memmap.Float32, Shape: []int{}},
	}
	want := `[{"key":["next","obs"],"dtype":"torch.bfloat16","shape":[2,3]},` +
		`{"key":["a"],"dtype":"torch.int64","shape":null},{"key":["r"],"dtype":"torch.float32","shape":[]}]`
	data, err := json.Marshal(s)
	if err != nil || string(data) != want {
		t.Fatalf("json = %s, %v\nwant %s", data, err, want)
	}
	var back RowSchema
	if err := json.Unmarshal(data, &back); err != nil || !reflect.DeepEqual(back, s) {
		t.Fatalf("json back = %v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`[{"key":["a"],"dtype":"torch.int65","shape":[]}]`), &back); !errors.Is(err, memmap.ErrDType) {
		t.Fatalf("json with an unknown dtype: %v, want ErrDType", err)
	}
	if _, err := json.Marshal(RowSchema{{Key: []string{"a"}}}); !errors.Is(err, memmap.ErrDType) {
		t.Fatalf("json of a field without a dtype: %v, want ErrDType", err)
	}
	full, err := json.Marshal(Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{70000, 28, 28}})
	if err != nil || string(full) != `{"key":["x"],"dtype":"torch.uint8","shape":[70000,28,28]}` {
		t.Fatalf("json of a Field = %s, %v", full, err)
	}
}

// msgpackHandle is the rpc package's codec configuration (rpc/wire.go).
var msgpackHandle = &codec.MsgpackHandle{WriteExt: true}

// TestRowField_Msgpack pins the wire form (docs/protocol.md): a map whose
// dtype is a msgpack str (a-prefixed), not a bin (c4), nor a number.
func TestRowField_Msgpack(t *testing.T) {
	for _, v := range []any{
		&RowField{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{4, 4}},
		&Field{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{4, 4}},
	} {
		want, _ := hex.DecodeString("83" + "a56474797065" + "ab746f7263682e75696e7438" +
			"a36b6579" + "91a36f6273" + "a57368617065" + "920404")
		var got []byte
		if err := codec.NewEncoderBytes(&got, msgpackHandle).Encode(v); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%T\n got %x\nwant %x", v, got, want)
		}
		back := reflect.New(reflect.TypeOf(v).Elem())
		if err := codec.NewDecoderBytes(want, msgpackHandle).Decode(back.Interface()); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back.Interface(), v) {
			t.Fatalf("decoded %v, want %v", back.Interface(), v)
		}
	}

	// In a slice and by value, as the replay and rpc messages hold them.
	msg := struct {
		S RowSchema `codec:"s"`
		F []Field   `codec:"f"`
	}{S: RowSchema{{Key: []string{"a"}, DType: memmap.Complex128}}, F: []Field{{Key: []string{"b"}, DType: memmap.Bool, Shape: []int{}}}}
	var data []byte
	if err := codec.NewEncoderBytes(&data, msgpackHandle).Encode(msg); err != nil {
		t.Fatal(err)
	}
	back := msg
	back.S, back.F = nil, nil
	if err := codec.NewDecoderBytes(data, msgpackHandle).Decode(&back); err != nil || !reflect.DeepEqual(back, msg) {
		t.Fatalf("message back = %+v, %v; want %+v", back, err, msg)
	}

	// An unknown dtype name, or a field without a dtype, is an error.
	for _, in := range []any{
		map[string]any{"key": []string{"a"}, "dtype": "torch.int65", "shape": []int{}},
		map[string]any{"key": []string{"a"}},
	} {
		var b []byte
		if err := codec.NewEncoderBytes(&b, msgpackHandle).Encode([]any{in}); err != nil {
			t.Fatal(err)
		}
		var s RowSchema
		if err := codec.NewDecoderBytes(b, msgpackHandle).Decode(&s); err == nil || !strings.Contains(err.Error(), "bad dtype") {
			t.Errorf("decode %v: %v, %v; want a dtype error", in, s, err)
		}
	}
	// A nil in place of a field decodes as the zero field (go-msgpack does
	// not ask the type), which Validate refuses.
	var b []byte
	if err := codec.NewEncoderBytes(&b, msgpackHandle).Encode([]any{nil}); err != nil {
		t.Fatal(err)
	}
	var s RowSchema
	if err := codec.NewDecoderBytes(b, msgpackHandle).Decode(&s); err != nil || len(s) != 1 || !errors.Is(s.Validate(), ErrSchema) {
		t.Errorf("decode [nil]: %v, %v; want a field Validate refuses", s, err)
	}
	b = nil
	if err := codec.NewEncoderBytes(&b, msgpackHandle).Encode(RowField{Key: []string{"a"}}); err == nil || !strings.Contains(err.Error(), "bad dtype") {
		t.Errorf("encode a field without a dtype: %x, %v; want a dtype error", b, err)
	}
}
