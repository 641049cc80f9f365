package collective

import "testing"

// TestOperations_Table: the wire ids are the ones every version has sent
// (a kind is the first byte of a desc), each row has one kind and one
// name, and every row has its functions.
func TestOperations_Table(t *testing.T) {
	wire := map[string]kind{"Allreduce": 1, "Bcast": 2, "Reduce": 3, "Gather": 4, "Allgather": 5,
		"Scatter": 6, "Alltoall": 7, "ReduceScatter": 8, "Barrier": 9}
	kinds, names := map[kind]bool{}, map[string]bool{}
	for _, o := range operations {
		if kinds[o.kind] || names[o.name] {
			t.Errorf("%v (%d): a kind or name twice", o.name, o.kind)
		}
		kinds[o.kind], names[o.name] = true, true
		if k, ok := wire[o.name]; ok && k != o.kind {
			t.Errorf("%s has wire id %d; it was %d", o.name, o.kind, k)
		}
		if o.kind == 0 || o.kind.String() != o.name || o.outShape == nil || o.shm == nil || o.tcp == nil {
			t.Errorf("%v (%d): an incomplete row", o.name, o.kind)
		}
	}
	for name := range wire {
		if !names[name] {
			t.Errorf("%s has no row", name)
		}
	}
	if s := kind(200).String(); s != "kind(200)" {
		t.Errorf("kind(200).String() = %q", s)
	}
}
