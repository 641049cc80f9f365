package tensordict

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// String returns td as tensordict's repr prints it: fields sorted, one per
// line, with batch size, device and sharing, so that a TensorDict built here
// and its Python twin print the same. A memory-mapped TensorDict prints its
// leaves as MemoryMappedTensor with device cpu, as a loaded one does in
// Python.
func (td *TensorDict) String() string {
	fields := make([]string, 0, len(td.keys))
	for _, k := range td.keys {
		switch v := td.vals[k].(type) {
		case *Tensor:
			fields = append(fields, k+": "+v.repr())
		case *TensorDict:
			fields = append(fields, k+": "+v.String())
		case *NonTensor:
			fields = append(fields, k+": "+v.repr(td.batch))
		}
	}
	slices.Sort(fields) // tensordict sorts the formatted lines, not the keys
	var body string
	if len(fields) > 0 {
		body = "\n" + strings.Join(fields, ",\n")
	}
	device := "None"
	if td.prefix != "" || td.locked {
		device = "cpu"
	}
	parts := []string{
		"fields={" + indent(body) + "}",
		"batch_size=" + torchSize(td.batch),
		"device=" + device,
		"is_shared=False",
	}
	for i, p := range parts {
		parts[i] = indent(p)
	}
	return "TensorDict(\n" + strings.Join(parts, ",\n") + ")"
}

// repr prints a leaf as tensordict prints tensors inside a TensorDict.
func (t *Tensor) repr() string {
	kind := "Tensor"
	if t.mm != nil {
		kind = "MemoryMappedTensor"
	}
	return fmt.Sprintf("%s(shape=%s, device=cpu, dtype=%v, is_shared=False)", kind, torchSize(t.shape), t.dtype)
}

// repr prints a non-tensor as tensordict's NonTensorData repr.
func (n *NonTensor) repr(batch []int) string {
	b, _ := json.Marshal(n.Data) // checked encodable when set
	s := string(b)
	if str, ok := n.Data.(string); ok {
		s = str
	}
	if len(s) > 200 {
		s = s[:20] + "  ...  " + s[len(s)-20:]
	}
	return fmt.Sprintf("NonTensorData(data=%s, batch_size=%s, device=None)", s, torchSize(batch))
}

// torchSize prints a shape as torch.Size does: torch.Size([4, 3]).
func torchSize(shape []int) string {
	s := make([]string, len(shape))
	for i, d := range shape {
		s[i] = fmt.Sprint(d)
	}
	return "torch.Size([" + strings.Join(s, ", ") + "])"
}

// indent prefixes every non-empty line with four spaces, as Python's
// textwrap.indent does.
func indent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = "    " + l
		}
	}
	return strings.Join(lines, "\n")
}

// jsonEqual reports whether a and b encode to the same JSON.
func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}
