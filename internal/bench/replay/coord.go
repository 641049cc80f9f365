package replay

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// The buffer node paces the run. Besides the replay service it serves
// methodBarrier: every participant (writer or trainer) calls it with each
// phase in turn, and each call returns once every participant has made it,
// so that all start the warm-up, the memcpy measurement and the timed phase
// at the same moment, wherever they run. The node also tells participants
// the run's settings (barrierResponse), so that only the buffer role needs
// them on its command line.
const methodBarrier = "replaybench.barrier"

// The phases, in order.
const (
	phaseStart  = "start"  // every participant has connected: the warm-up begins
	phaseFilled = "filled" // the writers have filled the capacity: the trainer measures the memcpy limit
	phaseTimed  = "timed"  // the timed phase begins
	phaseDone   = "done"   // every participant has finished
)

var phases = []string{phaseStart, phaseFilled, phaseTimed, phaseDone}

// Participant roles, and how many of each a run has.
const (
	roleWriter  = "writer"
	roleTrainer = "trainer"
	roleBuffer  = "buffer"
	trainers    = 1
)

type barrierRequest struct {
	Phase string `codec:"phase"`
	Role  string `codec:"role"` // phaseStart: roleWriter or roleTrainer
	Mode  string `codec:"mode"` // phaseStart: the participant's mode, modeOf
}

// barrierResponse is the run as the buffer node was told to run it.
type barrierResponse struct {
	Index      int   `codec:"index"` // phaseStart: the participant's number among its role's, from 0
	Writers    int   `codec:"writers"`
	Capacity   int   `codec:"capacity"`
	DurationNS int64 `codec:"duration_ns"` // of the timed phase
}

// coordinator is the buffer node's side of methodBarrier.
type coordinator struct {
	run barrierResponse

	mu       sync.Mutex
	taken    map[string][]bool // per role: which indices are taken
	mode     string            // the participants' mode, once one has joined; modeMixed when they differ
	gates    map[string]*gate
	phase    string    // the last phase that opened; "" before the first
	since    time.Time // when it opened
	finished chan struct{}
}

// gate is one phase's barrier.
type gate struct {
	arrived int
	open    chan struct{} // closed once every participant has arrived
}

// newCoordinator returns the coordinator of a run with the given number of
// writers (and one trainer).
func newCoordinator(writers, capacity int, d time.Duration) *coordinator {
	c := &coordinator{
		run:      barrierResponse{Writers: writers, Capacity: capacity, DurationNS: int64(d)},
		taken:    map[string][]bool{roleWriter: make([]bool, writers), roleTrainer: make([]bool, trainers)},
		gates:    map[string]*gate{},
		finished: make(chan struct{}),
	}
	for _, p := range phases {
		c.gates[p] = &gate{open: make(chan struct{})}
	}
	return c
}

func (c *coordinator) register(s *rpc.Server) error {
	return rpc.Register(s, methodBarrier, c.barrier)
}

func (c *coordinator) participants() int { return c.run.Writers + trainers }

// barrier waits until every participant has called it with req.Phase, or
// ctx ends (the caller gave up or went away: it no longer counts).
// phaseStart admits up to Writers writers and one trainer, all in the same
// mode, and gives each its index.
func (c *coordinator) barrier(ctx context.Context, req barrierRequest) (barrierResponse, error) {
	if !slices.Contains(phases, req.Phase) {
		return barrierResponse{}, rpc.Errorf(rpc.InvalidArgument, "replaybench: unknown phase %q", req.Phase)
	}
	c.mu.Lock()
	resp := c.run
	if req.Phase == phaseStart {
		var err error
		if resp.Index, err = c.joinLocked(req); err != nil {
			c.mu.Unlock()
			return barrierResponse{}, err
		}
	}
	g := c.gates[req.Phase]
	g.arrived++
	if g.arrived == c.participants() {
		close(g.open)
		c.phase, c.since = req.Phase, time.Now()
		if req.Phase == phaseDone {
			close(c.finished)
		}
	}
	c.mu.Unlock()

	select {
	case <-g.open:
		return resp, nil
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-g.open: // it opened meanwhile: the caller counted
		return resp, nil
	default:
	}
	g.arrived--
	if req.Phase == phaseStart {
		c.taken[req.Role][resp.Index] = false
		if g.arrived == 0 {
			c.mode = ""
		}
	}
	return barrierResponse{}, ctx.Err()
}

// joinLocked admits a participant at phaseStart and returns its index.
func (c *coordinator) joinLocked(req barrierRequest) (int, error) {
	taken, ok := c.taken[req.Role]
	if !ok {
		return 0, rpc.Errorf(rpc.InvalidArgument, "replaybench: unknown role %q", req.Role)
	}
	i := slices.Index(taken, false)
	if i < 0 {
		return 0, rpc.Errorf(rpc.FailedPrecondition, "replaybench: the run already has its %d %s(s)", len(taken), req.Role)
	}
	taken[i] = true
	// Participants may work in different modes: one whose root is the
	// node's files through another page cache (another machine) goes by
	// bytes while those on the node's page cache go by reference. Each
	// reports its own mode; the run's is "mixed" then.
	if c.mode == "" || c.mode == req.Mode {
		c.mode = req.Mode
	} else {
		c.mode = modeMixed
	}
	return i, nil
}

// state returns the participants' mode, the last phase that opened ("" if
// none has) and when it did.
func (c *coordinator) state() (mode, phase string, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mode, c.phase, c.since
}

// arrived returns how many participants wait at phase, or have passed it.
func (c *coordinator) arrived(phase string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gates[phase].arrived
}

// callBarrier is a participant's side of methodBarrier.
func callBarrier(ctx context.Context, rc *rpc.Client, req barrierRequest) (barrierResponse, error) {
	return rpc.Call[barrierResponse](ctx, rc, methodBarrier, req)
}

// modeMixed is the run's mode when its participants work in different
// modes.
const modeMixed = "mixed"
