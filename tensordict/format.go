package tensordict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"unicode/utf8"

	"github.com/tensorwire/tensorwire/memmap"
)

// The _type strings tensordict writes in meta.json (str(type(obj)) in
// Python). Older releases named the TensorDict class from the
// tensordict.tensordict module.
const (
	typeTensorDict    = "<class 'tensordict._td.TensorDict'>"
	typeTensorDictOld = "<class 'tensordict.tensordict.TensorDict'>"
	typeNonTensorData = "<class 'tensordict.tensorclass.NonTensorData'>"
)

// Names in the folder of a memory-mapped TensorDict.
const (
	metaFile   = "meta.json"
	leafSuffix = ".memmap"
	pickleFile = "other.pickle" // tensordict's pickled non-tensor data: refused
)

// reservedKeys share meta.json's namespace with the TensorDict's own fields:
// tensordict silently overwrites an entry of that name, so they are refused.
var reservedKeys = map[string]bool{"shape": true, "device": true, "_type": true}

// escapeKey returns the file-system name of a key as tensordict 0.14
// (_encode_key_for_filesystem, robust_key=True) writes it: the whole key ""
// is "%", "." is "%2E" and ".." is "%2E%2E" (none of them names a file of
// its own; the escaping below never yields a bare "%"); in any other key
// each of / < > : " | ? * \ space % NUL, the other control characters and
// DEL becomes %XX in uppercase hex, and every other character, "." and
// non-ASCII included, stays as it is. The name is always one path
// component other than "." and "..", so it never leaves its folder;
// tensordict 0.13 escaped "", "." and ".." as themselves.
func escapeKey(key string) string {
	switch key {
	case "":
		return "%"
	case ".", "..":
		return strings.Repeat("%2E", len(key))
	}
	var b strings.Builder
	for _, r := range key {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(`/<>:"|?*\ %`, r) {
			fmt.Fprintf(&b, "%%%02X", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// legacyName returns the name tensordict before 0.14 may have written for
// key with suffix (leafSuffix, or "" for a folder), and whether there is
// one worth trying that stays in its folder on this system: see
// legacyNameOn.
func legacyName(key, suffix string) (string, bool) {
	return legacyNameOn(runtime.GOOS == "windows", key, suffix)
}

// legacyNameOn is legacyName for Windows (windows set) or another system:
// the raw key, when it is a single path component. That excludes a key
// with "/" or NUL and, on Windows, one with "\" (a separator there) or ":"
// (a drive, as in "C:x", or an alternate data stream), as tensordict 0.14
// refuses a raw name with "/", "\" or a drive prefix. A leaf "" was
// ".memmap", "." "..memmap" and ".." "...memmap" (0.13's escaping); a folder
// of those names would be the folder itself or its parent, so there is
// none.
func legacyNameOn(windows bool, key, suffix string) (string, bool) {
	if strings.ContainsAny(key, "/\x00") || windows && strings.ContainsAny(key, `\:`) {
		return "", false
	}
	name := key + suffix
	if name == "" || name == "." || name == ".." {
		return "", false
	}
	return name, true
}

// checkKeyForDisk returns an error for a key that cannot be written: a
// reserved meta.json name, or invalid UTF-8.
func checkKeyForDisk(key string) error {
	switch {
	case reservedKeys[key]:
		return fmt.Errorf("%w: %q clashes with a meta.json field", ErrKey, key)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrKey, key)
	}
	return nil
}

// member is one name/value pair of a JSON object, in file order.
type member struct {
	key string
	val json.RawMessage
}

// errRepeatedName is a JSON object that names a member twice.
var errRepeatedName = errors.New("a member name is repeated")

// parseObject decodes a JSON object keeping its members' order, which
// encoding/json's maps lose. It accepts compact and spaced JSON alike, and
// refuses an object that repeats a name (errRepeatedName): JSON allows it
// and Python keeps the last, but no tensordict writes one, and in a
// meta.json each repeat of a nested TensorDict's key would be loaded again.
func parseObject(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("not a JSON object")
	}
	var out []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var m member
		m.key = tok.(string) // object keys are always strings
		if seen[m.key] {
			return nil, fmt.Errorf("%w: %q", errRepeatedName, m.key)
		}
		seen[m.key] = true
		if err := dec.Decode(&m.val); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the JSON object")
	}
	return out, nil
}

// leafEntry is meta.json's entry for a tensor.
type leafEntry struct {
	Device   string `json:"device"`
	Shape    []int  `json:"shape"`
	DType    string `json:"dtype"`
	IsNested bool   `json:"is_nested"`
}

// entry is any meta.json entry: a leaf's fields, or a collection's "type".
type entry struct {
	leafEntry
	Type *string `json:"type"`
}

// jsonWriter builds meta.json the way orjson writes it: compact, members in
// insertion order, UTF-8 unescaped, no HTML escaping, no trailing newline.
type jsonWriter struct {
	buf   bytes.Buffer
	first bool
}

func newJSONObject() *jsonWriter {
	w := &jsonWriter{first: true}
	w.buf.WriteByte('{')
	return w
}

// member appends "key":value, value encoded by encoding/json.
func (w *jsonWriter) member(key string, v any) error {
	if !w.first {
		w.buf.WriteByte(',')
	}
	w.first = false
	if err := encodeJSON(&w.buf, key); err != nil {
		return err
	}
	w.buf.WriteByte(':')
	return encodeJSON(&w.buf, v)
}

func (w *jsonWriter) bytes() []byte {
	w.buf.WriteByte('}')
	return w.buf.Bytes()
}

func encodeJSON(buf *bytes.Buffer, v any) error {
	var tmp bytes.Buffer
	enc := json.NewEncoder(&tmp)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b := tmp.Bytes()
	buf.Write(unescapeLineSeparators(b[:len(b)-1])) // Encode ends with a newline
	return nil
}

// unescapeLineSeparators writes U+2028 and U+2029 back as UTF-8 in JSON
// that encoding/json wrote: it escapes them as \u2028 and \u2029 whatever
// SetEscapeHTML says, orjson and Python's json (ensure_ascii=False) do not.
// Every backslash in encoding/json's output starts an escape inside a
// string, so an escaped backslash followed by "u2028" is left alone.
func unescapeLineSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		if esc := b[i+1:]; len(esc) >= 5 && string(esc[:4]) == "u202" && (esc[4] == '8' || esc[4] == '9') {
			out = utf8.AppendRune(out, rune(0x2028+int(esc[4]-'8')))
			i += 5
			continue
		}
		out = append(out, b[i], b[i+1])
		i++
	}
	return out
}

// shapeJSON keeps an empty shape as [] rather than null.
func shapeJSON(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

// tensorMeta returns meta.json's entry for t.
func tensorMeta(t *Tensor) leafEntry {
	return leafEntry{Device: "cpu", Shape: shapeJSON(t.shape), DType: t.dtype.String()}
}

// parseLeaf validates a leaf entry into a dtype and shape.
func parseLeaf(e leafEntry) (memmap.DType, []int, error) {
	dt, err := memmap.ParseDType(e.DType)
	if err != nil {
		return memmap.Invalid, nil, err
	}
	if e.DType != dt.String() {
		return memmap.Invalid, nil, fmt.Errorf("%w: %q is not a name torch writes", memmap.ErrDType, e.DType)
	}
	if _, err := memmap.NumBytes(dt, e.Shape); err != nil {
		return memmap.Invalid, nil, err
	}
	return dt, e.Shape, nil
}
