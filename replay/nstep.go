package replay

import "fmt"

// NStepReturns are n-step returns over a sample of slices, row by row
// (NStep).
type NStepReturns struct {
	Return   []float64 // sum_{k<m} gamma^k reward[t+k]
	Discount []float64 // gamma^m, or 0 when the m steps end in a terminal step
	Steps    []int     // m
	Last     []int     // t+m-1: the row whose next observation bootstraps
}

// NStep computes n-step returns at sample time over a sample of slices
// (SampleSlices), so that writers store single steps (torchrl's
// MultiStepTransform, Acme's n-step adder). reward and done are row by row
// (done: the step ended its episode); mask is SliceInfo.Mask (nil: every
// row a step). m = min(n, the steps to the end of the row's episode, done
// included, the steps to the end of its slice). Padding rows get 0, 0, 0
// and their own row. Python's tensorwire.replay_seq.nstep_returns is the
// same computation.
func NStep(reward []float64, done, mask []bool, gamma float64, n, sliceLen int) (NStepReturns, error) {
	rows := len(reward)
	if len(done) != rows || (mask != nil && len(mask) != rows) || sliceLen <= 0 || rows%sliceLen != 0 || n < 1 {
		return NStepReturns{}, fmt.Errorf("%w: n-step over %d rewards, %d dones, %d mask rows, slices of %d, n=%d",
			ErrArgument, rows, len(done), len(mask), sliceLen, n)
	}
	out := NStepReturns{Return: make([]float64, rows), Discount: make([]float64, rows), Steps: make([]int, rows), Last: make([]int, rows)}
	step := func(i int) bool { return mask == nil || mask[i] }
	for t := range rows {
		out.Last[t] = t
		if !step(t) {
			continue
		}
		end := (t/sliceLen + 1) * sliceLen
		g, scale, terminal := 0.0, 1.0, false
		for j := t; j < t+n && j < end && step(j); j++ {
			g += scale * reward[j]
			scale *= gamma
			out.Steps[t]++
			out.Last[t] = j
			if done[j] {
				terminal = true
				break
			}
		}
		out.Return[t] = g
		if !terminal {
			out.Discount[t] = scale
		}
	}
	return out, nil
}
