package collective

// Barrier: every rank waits for every other; no data moves.

const kindBarrier kind = 9
