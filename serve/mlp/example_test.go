package mlp_test

import (
	"context"
	"fmt"
	"log"

	"github.com/tensorwire/tensorwire/serve/mlp"
)

// An MLP loaded with parameters keyed as PyTorch's state_dict keys
// nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16)):
// "0.weight" [256 64], "0.bias" [256], "2.weight" [16 256], "2.bias" [16].
// From a file PyTorch wrote, params would be
// tensordict.LoadMemmap(prefix, tensordict.ReadOnly()).
func ExampleMLP() {
	params := mlp.Random([]int{64, 256, 16}, 1)
	sizes, err := mlp.SizesOf(params)
	if err != nil {
		log.Fatal(err)
	}
	m, err := mlp.New(mlp.Config{Sizes: sizes})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Load(context.Background(), params); err != nil {
		log.Fatal(err)
	}
	in, _ := m.Input().Zeros(3) // three rows of "obs"
	out, err := m.Forward(context.Background(), in)
	if err != nil {
		log.Fatal(err)
	}
	logits, _ := out.Tensor(mlp.DefaultOut)
	fmt.Println(sizes, logits.Shape())
	// Output:
	// [64 256 16] [3 16]
}
