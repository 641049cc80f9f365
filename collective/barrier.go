package collective

import "context"

// Barrier: every rank waits for every other; no data moves.

const kindBarrier kind = 9

// Barrier returns once every rank has called it.
func (c *Comm) Barrier(ctx context.Context) error {
	_, _, err := c.collective(ctx, &call{d: desc{kind: kindBarrier}})
	return err
}
