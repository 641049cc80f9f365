package serve

import (
	"time"
	"unsafe"

	"github.com/tensorwire/tensorwire/tensordict"
)

// counters are the manager's statistics, guarded by Manager.mu.
type counters struct {
	requests   uint64
	queueFull  uint64
	batches    uint64
	rows       uint64
	failed     uint64 // batches
	failedRows uint64
	replaced   uint64
	switches   uint64
	forward    time.Duration
	attached   uint64 // replicas attached (attach.go)
	detached   uint64
	orphaned   uint64   // batches and requests failed for want of a replica
	hist       []uint64 // batches by size, index = rows
}

// Stats are a manager's counters since it started.
type Stats struct {
	Requests   uint64        `codec:"requests" json:"requests"`       // queued (not refused)
	QueueFull  uint64        `codec:"queue_full" json:"queue_full"`   // refused with ErrQueueFull
	Batches    uint64        `codec:"batches" json:"batches"`         // Forward calls
	Rows       uint64        `codec:"rows" json:"rows"`               // rows in them
	Failed     uint64        `codec:"failed" json:"failed"`           // batches whose Forward failed
	FailedRows uint64        `codec:"failed_rows" json:"failed_rows"` // rows in them
	Replaced   uint64        `codec:"replaced" json:"replaced"`       // replicas' models replaced after a failure
	Switches   uint64        `codec:"switches" json:"switches"`       // replicas switched to new parameters
	Forward    time.Duration `codec:"forward_ns" json:"forward_ns"`   // time in Forward, all replicas
	Queued     int           `codec:"queued" json:"queued"`           // rows waiting now
	Version    uint64        `codec:"version" json:"version"`         // the latest parameter version
	// Sizes counts the batches by their rows: Sizes[n] batches of n rows,
	// n from 0 to the max batch (Sizes[0] is always 0).
	Sizes []uint64 `codec:"sizes" json:"sizes"`
	// Attached replicas (serve.replica): how many attached, how many
	// were detached (left, failed a batch, went silent), how many are
	// attached now, and the batches and requests failed with ErrNoReplica
	// for want of any replica. Absent from the wire when 0.
	Attached    uint64 `codec:"attached,omitempty" json:"attached,omitempty"`
	Detached    uint64 `codec:"detached,omitempty" json:"detached,omitempty"`
	AttachedNow int    `codec:"attached_now,omitempty" json:"attached_now,omitempty"`
	Orphaned    uint64 `codec:"orphaned,omitempty" json:"orphaned,omitempty"`
	// Clients is the number of remote clients registered (Service only).
	Clients int `codec:"clients" json:"clients"`
}

// MeanBatch returns the mean rows per batch, 0 before the first.
func (s Stats) MeanBatch() float64 {
	if s.Batches == 0 {
		return 0
	}
	return float64(s.Rows) / float64(s.Batches)
}

// Stats returns the manager's counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.st
	return Stats{
		Requests: c.requests, QueueFull: c.queueFull, Batches: c.batches, Rows: c.rows,
		Failed: c.failed, FailedRows: c.failedRows, Replaced: c.replaced, Switches: c.switches,
		Forward: c.forward, Queued: m.queued, Version: m.w.version, Sizes: append([]uint64(nil), c.hist...),
		Attached: c.attached, Detached: c.detached, AttachedNow: m.attachedNowLocked(), Orphaned: c.orphaned,
	}
}

// heapSpan returns the address and length of t's bytes when it is in Go
// memory, and 0, 0 for a mapped one.
func heapSpan(t *tensordict.Tensor) (uintptr, uintptr) {
	if t.Mapped() {
		return 0, 0
	}
	b, err := t.Bytes()
	if err != nil || len(b) == 0 {
		return 0, 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b))
}
