package memmap

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"errors"
	"testing"
)

func TestDType_MarshalTextIsTheTorchName(t *testing.T) {
	for d := Bool; d < numDTypes; d++ {
		text, err := d.MarshalText()
		if err != nil || string(text) != d.String() {
			t.Errorf("%v.MarshalText() = %q, %v; want %q", d, text, err, d.String())
		}
		bin, err := d.MarshalBinary()
		if err != nil || !bytes.Equal(bin, text) {
			t.Errorf("%v.MarshalBinary() = %q, %v; want %q", d, bin, err, text)
		}
		var back DType
		if err := back.UnmarshalText(text); err != nil || back != d {
			t.Errorf("UnmarshalText(%q) = %v, %v", text, back, err)
		}
		back = Invalid
		if err := back.UnmarshalBinary(bin); err != nil || back != d {
			t.Errorf("UnmarshalBinary(%q) = %v, %v", bin, back, err)
		}
	}
	for _, d := range []DType{Invalid, numDTypes, 200} {
		if text, err := d.MarshalText(); !errors.Is(err, ErrDType) {
			t.Errorf("%v.MarshalText() = %q, %v; want ErrDType", d, text, err)
		}
	}
}

func TestDType_UnmarshalText(t *testing.T) {
	for _, tc := range []struct {
		text string
		want DType
	}{
		{"torch.float32", Float32}, {"float32", Float32}, {"float", Float32}, {"torch.long", Int64},
		{"torch.bfloat16", BFloat16}, {"bool", Bool},
	} {
		var d DType
		if err := d.UnmarshalText([]byte(tc.text)); err != nil || d != tc.want {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", tc.text, d, err, tc.want)
		}
	}
	for _, bad := range []string{"", "torch.", "torch.float8_e4m3fn", "Float32", "memmap.DType(0)"} {
		d := Int8
		if err := d.UnmarshalText([]byte(bad)); !errors.Is(err, ErrDType) || d != Int8 {
			t.Errorf("UnmarshalText(%q) = %v, %v; want ErrDType and the value unchanged", bad, d, err)
		}
	}
}

// TestDType_Encoders checks that JSON and gob carry the name: a file or
// message never depends on the constants' order.
func TestDType_Encoders(t *testing.T) {
	type field struct {
		DType DType `json:"dtype"`
	}
	data, err := json.Marshal(field{BFloat16})
	if err != nil || string(data) != `{"dtype":"torch.bfloat16"}` {
		t.Fatalf("json: %s, %v", data, err)
	}
	var back field
	if err := json.Unmarshal([]byte(`{"dtype":"torch.complex64"}`), &back); err != nil || back.DType != Complex64 {
		t.Fatalf("json back: %v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"dtype":"torch.int65"}`), &back); !errors.Is(err, ErrDType) {
		t.Fatalf("json of an unknown dtype: %v, want ErrDType", err)
	}
	if err := json.Unmarshal([]byte(`{"dtype":12}`), &back); err == nil {
		t.Fatalf("json of a number: no error")
	}
	if _, err := json.Marshal(field{}); !errors.Is(err, ErrDType) {
		t.Fatalf("json of the zero DType: %v, want ErrDType", err)
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(field{Uint16}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(buf.Bytes(), []byte("torch.uint16")) {
		t.Fatalf("gob carries %q, not the name", buf.Bytes())
	}
	back = field{}
	if err := gob.NewDecoder(&buf).Decode(&back); err != nil || back.DType != Uint16 {
		t.Fatalf("gob back: %v, %v", back, err)
	}
}
