package service

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
)

var (
	errConfig   = errors.New("pkg: bad config")
	errExists   = errors.New("pkg: exists")
	errNotFound = errors.New("pkg: no thing")
	errName     = errors.New("pkg: bad name")
)

func TestRegistry(t *testing.T) {
	root := t.TempDir()
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(real, "a", "b")
	if err := os.MkdirAll(inside, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()

	spec := Spec{Pkg: "pkg", Kind: "thing", Config: errConfig, Exists: errExists, NotFound: errNotFound}
	checked := spec
	checked.Check = func(name string) error {
		if strings.Contains(name, "/") {
			return errName
		}
		return nil
	}
	type op struct {
		add, remove, lookup string
		dir                 string // Add's folder
		want                error  // nil, or what the error matches
		rel                 string // Lookup's Rel
	}
	tests := []struct {
		name   string
		spec   Spec
		folder bool
		ops    []op
		names  []string
	}{
		{"add then lookup", spec, false, []op{{add: "x"}, {lookup: "x"}}, []string{"x"}},
		{"empty name", spec, false, []op{{add: "", want: errConfig}}, []string{}},
		{"check replaces the empty test", checked, false, []op{{add: "a/b", want: errName}, {add: ""}}, []string{""}},
		{"duplicate", spec, false, []op{{add: "x"}, {add: "x", want: errExists}}, []string{"x"}},
		{"duplicate matches ErrDuplicate", spec, false, []op{{add: "x"}, {add: "x", want: ErrDuplicate}}, []string{"x"}},
		{"not found", spec, false, []op{{lookup: "y", want: errNotFound}}, []string{}},
		{"removed", spec, false, []op{{add: "x"}, {add: "y"}, {remove: "x"}, {lookup: "x", want: errNotFound}, {lookup: "y"}}, []string{"y"}},
		{"added again after remove", spec, false, []op{{add: "x"}, {remove: "x"}, {add: "x"}}, []string{"x"}},
		{"sorted names", spec, false, []op{{add: "c"}, {add: "a"}, {add: "b"}}, []string{"a", "b", "c"}},
		{"folder under the root", spec, true, []op{{add: "x", dir: inside}, {lookup: "x", rel: "a/b"}}, []string{"x"}},
		{"the root itself", spec, true, []op{{add: "x", dir: root}, {lookup: "x", rel: "."}}, []string{"x"}},
		{"folder outside the root", spec, true, []op{{add: "x", dir: outside}, {lookup: "x", rel: ""}}, []string{"x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var folder func(string) string
			if tt.folder {
				folder = func(dir string) string { return dir }
			}
			r := NewRegistry(srv, tt.spec, folder)
			for i, o := range tt.ops {
				var err error
				switch {
				case o.remove != "":
					if _, ok := r.Remove(o.remove); !ok {
						t.Fatalf("op %d: Remove(%q) found nothing", i, o.remove)
					}
					continue
				case o.lookup != "":
					var e Entry[string]
					e, err = r.Lookup(o.lookup)
					if err == nil && e.Rel != o.rel {
						t.Errorf("op %d: Lookup(%q).Rel = %q, want %q", i, o.lookup, e.Rel, o.rel)
					}
				default:
					err = r.Add(o.add, o.dir)
				}
				if o.want == nil && err != nil || o.want != nil && !errors.Is(err, o.want) {
					t.Fatalf("op %d: err = %v, want %v", i, err, o.want)
				}
				if o.want != nil && !strings.HasPrefix(err.Error(), "pkg: ") {
					t.Errorf("op %d: %q does not name the package", i, err)
				}
			}
			if got := r.Names(); !slices.Equal(got, tt.names) {
				t.Errorf("Names() = %q, want %q", got, tt.names)
			}
		})
	}
}

// TestRegistryCodes checks that the errors cross the wire with the codes
// of the service's sentinels.
func TestRegistryCodes(t *testing.T) {
	r := NewRegistry[int](nil, Spec{Pkg: "pkg", Kind: "thing", Exists: rpc.ErrAlreadyExists, NotFound: rpc.ErrNotFound}, nil)
	if err := r.Add("x", 1); err != nil {
		t.Fatal(err)
	}
	if code := rpc.CodeOf(r.Add("x", 2)); code != rpc.AlreadyExists {
		t.Errorf("duplicate: code %v, want AlreadyExists", code)
	}
	if _, err := r.Lookup("y"); rpc.CodeOf(err) != rpc.NotFound {
		t.Errorf("not found: code %v, want NotFound", rpc.CodeOf(err))
	}
	if x, ok := r.Remove("x"); !ok || x != 1 {
		t.Errorf("Remove = %d, %v; want 1, true", x, ok)
	}
	if _, ok := r.Remove("x"); ok {
		t.Error("Remove of a name not served found one")
	}
}
