package collective

import (
	"context"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
	"gorgonia.org/tensor"
)

// TestDense_Allgather: gorgonia Dense values go through the collectives by
// tensordict.FromDense and Tensor.Dense, which do not copy.
func TestDense_Allgather(t *testing.T) {
	comms := group(t, 3, SHM)
	got := all(t, comms, func(ctx context.Context, c *Comm) (*tensor.Dense, error) {
		r := float32(c.Rank())
		d := tensor.New(tensor.WithShape(1, 2), tensor.WithBacking([]float32{r, 10 * r}))
		x, err := tensordict.FromDense(d)
		if err != nil {
			return nil, err
		}
		y, err := c.Allgather(ctx, x, 0)
		if err != nil {
			return nil, err
		}
		return y.Dense()
	})
	for r, d := range got {
		if !slices.Equal(d.Shape(), []int{3, 2}) || !slices.Equal(d.Data().([]float32), []float32{0, 0, 1, 10, 2, 20}) {
			t.Fatalf("rank %d: %v %v", r, d.Shape(), d.Data())
		}
	}
}
