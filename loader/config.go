package loader

import (
	"fmt"
	"log/slog"
	"time"
)

// Config says what a Producer serves and how.
type Config struct {
	// Dataset is the prefix of a memory-mapped TensorDict of batch size
	// [N, ...] (tensordict's format; "tensorwire import" makes one). Its
	// rows are the samples. It is mapped read-only.
	Dataset string

	// Dir is the ring's folder: created if missing, and it must otherwise
	// be a loader's ring folder or empty. Consumers that share the
	// filesystem map the ring from it, so for them it must lie under the
	// node's root (rpc.WithRoot); others get the batches as bytes.
	Dir string

	// Batch is the number of rows of a producer batch, the unit written
	// into a ring slot. Consumers cut their own batch sizes from these.
	Batch int

	// Slots is the number of batches the ring holds; 0 means 8. The ring
	// takes Slots × Batch rows of the transformed row size on disk (in
	// the page cache, on a tmpfs).
	Slots int

	// Window is how many batches into an epoch a consumer may join and
	// still get the whole epoch (tensorsocket's rubber band): it joins the
	// current epoch until the producer takes a slot for the epoch's batch
	// Window, and gets the batches it missed from the ring, which still
	// holds them. 0 means Slots/2; a negative Window lets nobody join an
	// epoch already begun. At most Slots: with Window = Slots, every
	// consumer that joins before the producer has had to wait for a slot
	// in this epoch gets the whole epoch.
	Window int

	// Seed seeds the per-epoch shuffle and the transform's random sources.
	Seed uint64

	// Sequential serves the rows in dataset order every epoch instead of
	// shuffling them.
	Sequential bool

	// Transform, if not nil, transforms every sample once, for all the
	// consumers (Augment, say). nil serves the rows as stored.
	Transform Transform

	// IndexKey, if set, adds a field of that key to every batch: int64, the
	// dataset index of each row.
	IndexKey string

	// Log receives the producer's failure (once, at ERROR, naming the file
	// at fault when one was truncated); nil discards it.
	Log *slog.Logger

	// Heartbeat is how long a consumer may stay silent before it is
	// dropped; 0 means 5s. Consumers send a heartbeat four times within it.
	Heartbeat time.Duration

	// MaxWait bounds how long the producer waits for the consumers to
	// release one ring slot; those still holding it then are dropped (a
	// consumer that never acks stalls nobody for longer). 0 means 1 minute.
	MaxWait time.Duration
}

// Defaults of the zero Config fields.
const (
	DefaultSlots     = 8
	DefaultHeartbeat = 5 * time.Second
	DefaultMaxWait   = time.Minute
)

// withDefaults returns c with its zero fields set, checked: ErrConfig for
// one that cannot make a producer.
func (c Config) withDefaults() (Config, error) {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Window == 0 {
		c.Window = c.Slots / 2
	}
	if c.Window < 0 {
		c.Window = 0
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	switch {
	case c.Dir == "":
		return c, fmt.Errorf("%w: no ring folder (Dir)", ErrConfig)
	case c.Batch <= 0:
		return c, fmt.Errorf("%w: batch size %d: want at least 1", ErrConfig, c.Batch)
	case c.Slots < 1:
		return c, fmt.Errorf("%w: %d slots: want at least 1", ErrConfig, c.Slots)
	case c.Window > c.Slots:
		return c, fmt.Errorf("%w: a window of %d batches is more than the ring's %d slots", ErrConfig, c.Window, c.Slots)
	case c.Heartbeat < 0 || c.MaxWait < 0:
		return c, fmt.Errorf("%w: negative heartbeat or max wait", ErrConfig)
	case int64(c.Batch)*int64(c.Slots) > 1<<31:
		return c, fmt.Errorf("%w: a ring of %d × %d rows", ErrConfig, c.Slots, c.Batch)
	}
	return c, nil
}
