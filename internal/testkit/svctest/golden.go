package svctest

import (
	"bytes"
	"encoding/hex"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/rpc"
)

// Golden messages: a service's golden_test.go lists one example of every
// message that crosses the wire (Example), and its testdata/wire/messages.hex
// holds their bytes, which the Python client's tests
// (python/tests/test_golden_services.py) check too and docs/protocol.md
// shows between "<!-- begin NAME messages -->" and "<!-- end NAME messages -->".
//
// The file is a list of messages, each a line "# NAME" followed by its
// bytes in hex, spaces and newlines free, with "quoted" ASCII standing for
// its bytes (a5 "store" is a5 73746f7265), as docs/protocol.md writes them.

// Example is one message: V, a value of the message's type (not a
// pointer), encoded as rpc encodes arguments and results.
type Example struct {
	Name string
	V    any
}

// handle encodes and decodes as rpc's (rpc/wire.go).
var handle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.RawToString = false
	h.MaxDepth = 64
	return h
}()

// Encode returns v's msgpack as rpc writes it.
func Encode(t testing.TB, v any) []byte {
	t.Helper()
	var out []byte
	if err := codec.NewEncoderBytes(&out, handle).Encode(v); err != nil {
		t.Fatal(err)
	}
	return out
}

// Decode decodes b, as rpc reads it, into v (a pointer).
func Decode(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := codec.NewDecoderBytes(b, handle).Decode(v); err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
}

var quoted = regexp.MustCompile(`"([^"]*)"`)

// Unhex returns the bytes of hex written as the golden files write it.
func Unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = quoted.ReplaceAllStringFunc(s, func(q string) string { return hex.EncodeToString([]byte(q[1 : len(q)-1])) })
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WireTD returns the TD whose wire form (docs/protocol.md, "TensorDicts")
// is the msgpack given in hex: a message's TD field as it crosses.
func WireTD(t testing.TB, s string) *rpc.TD {
	t.Helper()
	var td rpc.TD
	Decode(t, Unhex(t, s), &td)
	return &td
}

// ParseGolden returns the messages of a golden file's text, in order.
func ParseGolden(t testing.TB, text string) (names []string, msgs map[string][]byte) {
	t.Helper()
	msgs = map[string][]byte{}
	var name string
	var body strings.Builder
	flush := func() {
		if name == "" {
			if strings.TrimSpace(body.String()) != "" {
				t.Fatalf("golden messages: bytes before the first # NAME line")
			}
			return
		}
		if _, dup := msgs[name]; dup {
			t.Fatalf("golden messages: %q given twice", name)
		}
		names = append(names, name)
		msgs[name] = Unhex(t, body.String())
	}
	for _, line := range strings.Split(text, "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "# "); ok {
			flush()
			name, body = n, strings.Builder{}
			continue
		}
		body.WriteString(line)
		body.WriteString("\n")
	}
	flush()
	return names, msgs
}

// GoldenFile is the file of a package's golden messages.
const GoldenFile = "testdata/wire/messages.hex"

// CheckGolden checks every example against GoldenFile: its bytes are the
// file's, byte for byte, and the file's bytes decode into a value equal
// to it; the file holds no message that is not an example.
func CheckGolden(t *testing.T, examples []Example) {
	t.Helper()
	data, err := os.ReadFile(GoldenFile)
	if err != nil {
		t.Fatal(err)
	}
	names, msgs := ParseGolden(t, string(data))
	seen := map[string]bool{}
	for _, ex := range examples {
		seen[ex.Name] = true
		t.Run(ex.Name, func(t *testing.T) {
			want, ok := msgs[ex.Name]
			if !ok {
				t.Fatalf("%s has no %q: add\n%x", GoldenFile, ex.Name, Encode(t, ex.V))
			}
			if got := Encode(t, ex.V); !bytes.Equal(got, want) {
				t.Errorf("%T encoded as\n%x\nwant\n%x", ex.V, got, want)
			}
			back := reflect.New(reflect.TypeOf(ex.V))
			Decode(t, want, back.Interface())
			if !reflect.DeepEqual(back.Elem().Interface(), ex.V) {
				t.Errorf("the golden bytes decoded as\n%+v\nwant\n%+v", back.Elem().Interface(), ex.V)
			}
		})
	}
	for _, n := range names {
		if !seen[n] {
			t.Errorf("%s holds %q, which no example is", GoldenFile, n)
		}
	}
}

// CheckGoldenDoc checks that docs/protocol.md (at doc) shows GoldenFile's
// messages, the same names in the same order with the same bytes, between
// "<!-- begin SERVICE messages -->" and "<!-- end SERVICE messages -->".
func CheckGoldenDoc(t *testing.T, doc, service string) {
	t.Helper()
	data, err := os.ReadFile(GoldenFile)
	if err != nil {
		t.Fatal(err)
	}
	names, msgs := ParseGolden(t, string(data))
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- begin "+service+" messages -->\n", "<!-- end "+service+" messages -->"
	_, rest, ok := strings.Cut(string(text), begin)
	block, _, ok2 := strings.Cut(rest, end)
	block = strings.TrimSpace(block)
	if !ok || !ok2 || !strings.HasPrefix(block, "```\n") || !strings.HasSuffix(block, "```") {
		t.Fatalf("%s has no fenced block between %q and %q", doc, strings.TrimSpace(begin), end)
	}
	docNames, docMsgs := ParseGolden(t, strings.TrimSuffix(strings.TrimPrefix(block, "```\n"), "```"))
	if !reflect.DeepEqual(docNames, names) {
		t.Fatalf("%s shows the %s messages\n%q\n%s holds\n%q", doc, service, docNames, GoldenFile, names)
	}
	for _, n := range names {
		if !bytes.Equal(docMsgs[n], msgs[n]) {
			t.Errorf("%s shows %s as\n%x\n%s holds\n%x", doc, n, docMsgs[n], GoldenFile, msgs[n])
		}
	}
}

// CheckGoldenSigned checks that the named message, with the given
// unsigned integers written in their smallest signed form instead
// (cf 1234567890abcdef as d3 1234567890abcdef), as the Python client
// writes every integer, decodes into the same value as its golden bytes.
func CheckGoldenSigned(t *testing.T, examples []Example, name string, values ...uint64) {
	t.Helper()
	data, err := os.ReadFile(GoldenFile)
	if err != nil {
		t.Fatal(err)
	}
	_, msgs := ParseGolden(t, string(data))
	b := bytes.Clone(msgs[name])
	for _, v := range values {
		if v < 128 || v >= 1<<63 {
			t.Fatalf("%d has one form, signed or not", v)
		}
		unsigned, signed := appendInt(nil, v, false), appendInt(nil, v, true)
		if !bytes.Contains(b, unsigned) {
			t.Fatalf("%s holds no %x", name, unsigned)
		}
		b = bytes.ReplaceAll(b, unsigned, signed)
	}
	for _, ex := range examples {
		if ex.Name != name {
			continue
		}
		back := reflect.New(reflect.TypeOf(ex.V))
		Decode(t, b, back.Interface())
		if !reflect.DeepEqual(back.Elem().Interface(), ex.V) {
			t.Errorf("%s with signed integers (%x) decoded as\n%+v\nwant\n%+v", name, b, back.Elem().Interface(), ex.V)
		}
		return
	}
	t.Fatalf("no example %q", name)
}

// appendInt appends v (128 to 1<<63-1) in its smallest unsigned or signed
// msgpack form.
func appendInt(b []byte, v uint64, signed bool) []byte {
	tags := [4]byte{0xcc, 0xcd, 0xce, 0xcf}
	if signed {
		tags = [4]byte{0xd0, 0xd1, 0xd2, 0xd3}
	}
	for i, n := range []int{1, 2, 4, 8} {
		if v < 1<<(8*n-1) || (!signed && (n == 8 || v < 1<<(8*n))) {
			b = append(b, tags[i])
			for k := n - 1; k >= 0; k-- {
				b = append(b, byte(v>>(8*k)))
			}
			return b
		}
	}
	panic("unreachable")
}
