package selector_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/tensorwire/tensorwire/replay/internal/selector"
)

func ExampleFIFO() {
	s := selector.FIFO(8)
	s.Insert(5, 1, 0) // slot 5 was written first
	s.Insert(2, 2, 0)
	s.Insert(7, 3, 0)
	slots, _, err := s.Select(nil, 2, nil, nil)
	fmt.Println(slots, err, s.Len())
	_, _, err = s.Select(nil, 2, nil, nil)
	fmt.Println(err)
	// Output:
	// [5 2] <nil> 1
	// selector: not enough sampleable slots: 2 asked for, 1 sampleable
}

func ExampleNew() {
	// A checkpoint stores the Spec; a restarted buffer rebuilds the
	// selector from it and inserts its committed slots again.
	var spec selector.Spec
	if err := json.Unmarshal([]byte(`{"kind":"prioritized","alpha":1,"beta":1}`), &spec); err != nil {
		panic(err)
	}
	s, err := selector.New(spec, 4)
	if err != nil {
		panic(err)
	}
	s.Insert(0, 1, 1) // P = 1/4, the least likely: weight 1
	s.Insert(1, 2, 3) // P = 3/4: weight (1/3)^beta
	rng := rand.New(rand.NewPCG(1, 2))
	slots, weights, _ := s.Select(rng, 1000, nil, nil)
	w := map[int]float64{}
	for i, slot := range slots {
		w[slot] = weights[i]
	}
	fmt.Printf("weights: slot 0 %.3f, slot 1 %.3f\n", w[0], w[1])
	// Output:
	// weights: slot 0 1.000, slot 1 0.333
}
