package selector

// denseSet is a set of slots in [0, capacity) kept as a dense array of its
// members plus each slot's position in that array, so that add, remove,
// membership and picking a uniformly random member are all O(1).
type denseSet struct {
	items []int // the members, in no particular order
	pos   []int // pos[slot] is 1 + slot's index in items; 0 if slot is absent
}

func newDenseSet(capacity int) denseSet {
	return denseSet{items: make([]int, 0, capacity), pos: make([]int, capacity)}
}

func (s *denseSet) len() int { return len(s.items) }

// has reports whether slot is a member; a slot out of range is not.
func (s *denseSet) has(slot int) bool {
	return slot >= 0 && slot < len(s.pos) && s.pos[slot] != 0
}

// add adds slot, which must be in range, and reports whether it was absent.
func (s *denseSet) add(slot int) bool {
	if s.pos[slot] != 0 {
		return false
	}
	s.items = append(s.items, slot)
	s.pos[slot] = len(s.items)
	return true
}

// remove removes slot, moving the last member into its place, and reports
// whether it was present.
func (s *denseSet) remove(slot int) bool {
	if !s.has(slot) {
		return false
	}
	i, last := s.pos[slot]-1, s.items[len(s.items)-1]
	s.items[i] = last
	s.pos[last] = i + 1
	s.items = s.items[:len(s.items)-1]
	s.pos[slot] = 0
	return true
}
