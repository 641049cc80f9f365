package service

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tensorwire/tensorwire/rpc"
)

// ErrDuplicate is matched (errors.Is) by every Registry's error for a name
// already served, beside the service's own sentinel (Spec.Exists), which
// gives it its code on the wire: AlreadyExists.
var ErrDuplicate = errors.New("a name already served")

// Spec says how a Registry names its things in errors, and with which of
// its service's sentinels.
type Spec struct {
	Pkg  string // the service, beginning the errors' text: "replay"
	Kind string // what a name names: "buffer"

	// Config is the service's sentinel for a bad name: "" (or one Check
	// refuses, with Check's own error).
	Config error
	// Exists is the service's sentinel of code AlreadyExists: Add of a name
	// already served matches it and ErrDuplicate.
	Exists error
	// NotFound is the service's sentinel of code NotFound: Lookup of a
	// name not served matches it.
	NotFound error
	// Check, when set, checks a name for Add in place of the test for "".
	Check func(name string) error
}

// Entry is a thing served, with its folder relative to the server's root.
type Entry[T any] struct {
	Item T
	Rel  string // slash-separated; "" when the thing has no folder under the root
}

// Registry is a set of things of type T served under names: a service's
// Add, Remove and lookup of the names its requests carry. It is safe for
// concurrent use.
type Registry[T any] struct {
	spec   Spec
	srv    *rpc.Server
	folder func(T) string

	mu    sync.RWMutex
	items map[string]Entry[T]
}

// NewRegistry returns an empty Registry. folder, when not nil, gives a
// thing's folder: Add names it relative to srv's root (rpc.Server.Rel) in
// the thing's Entry, for clients that share the root to open.
func NewRegistry[T any](srv *rpc.Server, spec Spec, folder func(T) string) *Registry[T] {
	return &Registry[T]{spec: spec, srv: srv, folder: folder, items: map[string]Entry[T]{}}
}

// Add serves x under name. It fails, matching Spec.Config, for a bad name,
// and, matching Spec.Exists and ErrDuplicate, for a name already served.
func (r *Registry[T]) Add(name string, x T) error {
	if r.spec.Check != nil {
		if err := r.spec.Check(name); err != nil {
			return err
		}
	} else if name == "" {
		return fmt.Errorf("%w: a %s needs a name", r.spec.Config, r.spec.Kind)
	}
	e := r.entry(x)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.items[name]; dup {
		return &nameError{
			msg:  fmt.Sprintf("%s: a %s named %q is already served", r.spec.Pkg, r.spec.Kind, name),
			errs: []error{r.spec.Exists, ErrDuplicate},
		}
	}
	r.items[name] = e
	return nil
}

// Replace serves x under name in place of what it served, in one step:
// a Lookup finds one or the other, never neither. It returns what name
// served; false if nothing (then it is Add without the checks).
func (r *Registry[T]) Replace(name string, x T) (T, bool) {
	e := r.entry(x)
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.items[name]
	r.items[name] = e
	return old.Item, ok
}

// Remove stops serving name and returns what it served; false if nothing.
func (r *Registry[T]) Remove(name string) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.items[name]
	delete(r.items, name)
	return e.Item, ok
}

// entry returns x's entry: its folder relative to the root, if any.
func (r *Registry[T]) entry(x T) Entry[T] {
	e := Entry[T]{Item: x}
	if r.folder != nil {
		e.Rel, _ = r.srv.Rel(r.folder(x))
	}
	return e
}

// Lookup returns the entry served under name, or an error matching
// Spec.NotFound.
func (r *Registry[T]) Lookup(name string) (Entry[T], error) {
	r.mu.RLock()
	e, ok := r.items[name]
	r.mu.RUnlock()
	if !ok {
		return Entry[T]{}, &nameError{
			msg:  fmt.Sprintf("%s: no %s named %q on this node", r.spec.Pkg, r.spec.Kind, name),
			errs: []error{r.spec.NotFound},
		}
	}
	return e, nil
}

// Names returns the names served, sorted.
func (r *Registry[T]) Names() []string {
	r.mu.RLock()
	names := make([]string, 0, len(r.items))
	for name := range r.items {
		names = append(names, name)
	}
	r.mu.RUnlock()
	slices.Sort(names)
	return names
}

// nameError is a Registry's error about a name: its own text, matching
// the sentinels in errs.
type nameError struct {
	msg  string
	errs []error
}

func (e *nameError) Error() string   { return e.msg }
func (e *nameError) Unwrap() []error { return e.errs }
