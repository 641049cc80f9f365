package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// "tensorwire collective rank" is a Python rank's sidecar: a real Go rank
// (collective.Join with the rendezvous, rank, size, token and transport
// given) that runs the calls its parent sends over its stdin, with the
// tensors' bytes in a file both map (collective_frame.go has the frames;
// docs/collective.md, "From Python", says why a sidecar).

var collectiveCmd = command{
	name:  "collective",
	usage: "tensorwire collective rank --addr HOST:PORT --rank R --size N --data FILE [--bell FILE] [--spin D] [--transport auto|shm|tcp|hier] [--shm-dir D] [--token-file F] [--join-timeout D] [--frozen-after D]",
	help: "be one rank of a collective communicator for the process that started it (the Python client's " +
		"tensorwire.collective starts one per rank): join the ranks at --addr (rank 0 listens there), then run " +
		"the calls that arrive as frames on stdin, with the tensors in --data, a file both processes map, and " +
		"answer each on stdout (docs/protocol.md, \"Collective sidecar pipe\"); with --bell, a second shared file whose " +
		"words say which frame each side wrote last, it watches for the next request for --spin before sleeping in " +
		"read, and says its replies there too; the token is --token-file's, or " +
		"$TENSORWIRE_TOKEN's; the rank ends when stdin closes (its parent died: the other ranks see a lost rank), " +
		"and breaks off when its parent stays stopped (SIGSTOP) for --frozen-after",
	run: runCollective,
}

func runCollective(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isHelp(args[0]) {
		return &helpRequest{}
	}
	if len(args) == 0 || args[0] != "rank" {
		return fmt.Errorf("%w: want \"collective rank\"", errUsage)
	}
	fs := flag.NewFlagSet("collective rank", flag.ContinueOnError)
	var cfg collective.Config
	fs.StringVar(&cfg.Addr, "addr", "", "rank 0's address, HOST:PORT (the rendezvous)")
	fs.IntVar(&cfg.Rank, "rank", -1, "this rank")
	fs.IntVar(&cfg.Size, "size", 0, "the number of ranks")
	transport := fs.String("transport", "auto", "auto, shm, tcp or hier")
	fs.StringVar(&cfg.ShmDir, "shm-dir", "", "the shared folder for shared mappings (default /dev/shm)")
	tokenFile := fs.String("token-file", "", "file holding the shared secret (default $TENSORWIRE_TOKEN)")
	data := fs.String("data", "", "the data file shared with the parent")
	bellPath := fs.String("bell", "", "the bell file shared with the parent (none: the pipe alone)")
	spin := fs.Duration("spin", 50*time.Microsecond, "with --bell: how long to watch for the next request before sleeping (0: not at all)")
	joinTimeout := fs.Duration("join-timeout", 60*time.Second, "how long to wait for the other ranks")
	frozen := fs.Duration("frozen-after", 5*time.Second, "break off when the parent stays stopped this long (0: never)")
	if _, err := parse(fs, args[1:]); err != nil {
		return err
	}
	switch *transport {
	case "auto", "":
		cfg.Transport = collective.Auto
	case "shm", "tcp", "hier":
		cfg.Transport = collective.Transport(*transport)
	default:
		return fmt.Errorf("%w: --transport %q: want auto, shm, tcp or hier", errUsage, *transport)
	}
	if *data == "" {
		return fmt.Errorf("%w: --data is required", errUsage)
	}
	if *tokenFile != "" {
		tok, err := nodeproc.ReadToken(*tokenFile)
		if err != nil {
			return err
		}
		cfg.Token = tok
	} else if tok := os.Getenv("TENSORWIRE_TOKEN"); tok != "" {
		cfg.Token = []byte(strings.TrimSpace(tok))
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if *spin < 0 || *spin > time.Second {
		return fmt.Errorf("%w: --spin %v: want 0 to 1s", errUsage, *spin)
	}
	if *joinTimeout < 0 {
		return fmt.Errorf("%w: --join-timeout %v is negative", errUsage, *joinTimeout)
	}
	sc := &sidecar{frozenAfter: *frozen, ppid: os.Getppid(), bellPath: *bellPath, spin: *spin}
	return sc.serve(ctx, cfg, *data, *joinTimeout, os.Stdin, stdout)
}

// sidecar is one Python rank's Go rank.
type sidecar struct {
	frozenAfter time.Duration
	ppid        int // the parent watched for SIGSTOP and its exit (0: none)
	bellPath    string
	spin        time.Duration

	bell *bell // nil: the pipe alone

	c    *collective.Comm
	cm   atomic.Pointer[collective.Comm] // c, for the watchers' goroutines
	d    *dataFile
	out  *bufio.Writer
	reqs map[int64]*pending
	bufs p2pBufs         // the pending requests' buffers, for reuse
	ctx  context.Context // ends when the parent is gone or frozen
}

// pending is an Isend or Irecv not waited for yet.
type pending struct {
	r    *collective.Request
	recv bool
	buf  []byte // the request's tensor's bytes (s.bufs); nil when kept
	// kept: the tensor is the data file's bytes at at (pyReq.Keep), held
	// (dataFile.holds) until the request is done.
	kept bool
	at   int64
}

// errParentGone and errParentFrozen are why a sidecar stops.
var (
	errParentGone   = errors.New("its Python process is gone (it exited, or the sidecar's stdin closed)")
	errParentFrozen = errors.New("its Python process is stopped")
)

// serve joins, says hello, and answers frames from in on out until in
// closes. It returns nil when in closes (errParentGone), after a close
// request, and when ctx ends (a signal); otherwise the error that stopped
// it, so that the command exits 1: the join's, a broken pipe's, a failed
// read's, bytes on in that are not a frame (errFrame, answered first with
// collective.sidecar, however the frame is malformed), or a parent
// stopped for frozenAfter (errParentFrozen). A call's error is a reply.
func (s *sidecar) serve(ctx context.Context, cfg collective.Config, dataPath string, joinTimeout time.Duration, in io.Reader, out io.Writer) error {
	s.out = bufio.NewWriterSize(out, 4096)
	s.reqs = map[int64]*pending{}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.ctx = ctx

	next := s.frames(ctx, cancel, in)
	if s.frozenAfter > 0 && s.ppid > 1 {
		go s.watchParent(ctx, cancel)
	}

	d, err := openDataFile(dataPath)
	if err != nil {
		s.reply(pyResp{Code: int(rpc.InvalidArgument), Reason: "collective.config", Msg: err.Error()})
		return err
	}
	s.d = d
	defer d.close()
	if s.bellPath != "" {
		b, err := openBell(s.bellPath, s.spin)
		if err != nil {
			s.reply(pyResp{Code: int(rpc.InvalidArgument), Reason: "collective.config", Msg: err.Error()})
			return err
		}
		s.bell = b
		defer b.close()
	}
	if err := cfg.Validate(); err != nil {
		s.replyErr(0, err)
		return err
	}
	jctx, jcancel := context.WithTimeout(ctx, joinTimeout)
	c, err := collective.Join(jctx, cfg)
	jcancel()
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		s.replyErr(0, err)
		return err
	}
	s.c = c
	s.cm.Store(c)
	defer c.Close()
	// The data file is a shared buffer of the communicator: an Allreduce
	// of tensors in it on every rank reads and writes them where they are
	// (collective.Comm.Register), without copies through its own files.
	d.mapped = func(mem []byte) {
		if err := c.Register(dataPath, mem); err != nil {
			slog.Debug("collective sidecar: the data file is not a shared buffer", "err", err)
		}
	}
	if len(d.mem) > 0 {
		d.mapped(d.mem)
	}
	if err := s.reply(pyResp{Rank: c.Rank(), World: c.Size(), Transport: transportName(c.Transport()), Pipe: pipeVersion}); err != nil {
		return err
	}
	var last int64 // the last request's id
	for {
		s.bell.await(uint32(last))
		b, ok := next()
		if ok && ctx.Err() != nil {
			ok = false // broken off (the parent froze) while the frame came
		}
		if !ok {
			// The parent is gone (or sent garbage, or froze): closing
			// tells the other ranks at once.
			cause := context.Cause(ctx)
			if cause == nil || errors.Is(cause, errParentGone) {
				return nil
			}
			slog.Warn("collective sidecar stops", "rank", cfg.Rank, "why", cause)
			if errors.Is(cause, errFrame) {
				s.reply(pyResp{Code: int(rpc.InvalidArgument), Reason: "collective.sidecar", Msg: cause.Error()})
			}
			if errors.Is(cause, context.Canceled) {
				return nil // ctx ended (SIGINT or SIGTERM): stopped as asked
			}
			return cause // a bad frame, a frozen parent, a failed read: exit 1
		}
		req, err := decodeReq(b)
		if err != nil {
			s.reply(pyResp{Code: int(rpc.InvalidArgument), Reason: "collective.sidecar", Msg: err.Error()})
			return err
		}
		last = req.ID
		resp, stop := s.handle(req)
		if req.Quiet && resp.Code == 0 && !stop {
			continue // started: the Python rank is not waiting for a reply
		}
		resp.ID = req.ID
		if resp.Code == 0 {
			resp.Size = int64(len(s.d.mem))
		}
		if err := s.reply(resp); err != nil {
			return err
		}
		s.bell.rung(resp.ID)
		if stop {
			return nil
		}
	}
}

// frames returns the function that gives the next frame from in, false
// once there is none (in closed, or ctx ended). Where it can, it reads in
// on the caller's goroutine, one wake-up fewer per call, and watches in
// for its writer's end (POLLHUP), and the parent for its exit, beside it
// (watchGone), so that a call in flight breaks off when the parent dies,
// and the sidecar goes when the parent died leaving a child that holds
// in's write end; elsewhere a goroutine reads in and hands the frames
// over.
func (s *sidecar) frames(ctx context.Context, cancel context.CancelCauseFunc, in io.Reader) func() ([]byte, bool) {
	ended := func(err error) {
		if errors.Is(err, io.EOF) {
			cancel(errParentGone)
		} else {
			cancel(err)
		}
	}
	r := bufio.NewReader(in)
	exited := func() {
		// The pipe's writer lives on in a child of the parent's, so the
		// frame read would wait for it: the rank breaks off, and the
		// process goes, since nobody is left to answer.
		s.breakOff(cancel, errParentGone)
		slog.Warn("collective sidecar stops", "why", errParentGone)
		os.Exit(1)
	}
	if f, ok := in.(*os.File); ok && watchGone(ctx, f, s.ppid, func() { cancel(errParentGone) }, exited) {
		return func() ([]byte, bool) {
			b, err := readFrame(r)
			if err != nil {
				ended(err)
				return nil, false
			}
			return b, true
		}
	}
	ch := make(chan []byte)
	go func() {
		defer close(ch)
		for {
			b, err := readFrame(r)
			if err != nil {
				ended(err)
				return
			}
			select {
			case ch <- b:
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() ([]byte, bool) {
		select {
		case b, ok := <-ch:
			return b, ok
		case <-ctx.Done():
			return nil, false
		}
	}
}

// breakOff ends the sidecar's calls with why (ctx's cause) and closes its
// communicator, if it joined one, so that the others see this rank lost
// at once, not at their next keep-alive. Any goroutine may call it.
func (s *sidecar) breakOff(cancel context.CancelCauseFunc, why error) {
	cancel(why)
	if c := s.cm.Load(); c != nil {
		c.Close()
	}
}

// watchParent breaks the rank off when its parent stays stopped for
// frozenAfter: the other ranks then fail as they would with a frozen Go
// rank, instead of waiting for its calls forever.
func (s *sidecar) watchParent(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.ppid))
		if err != nil {
			return // no /proc: nothing to watch
		}
		stopped := false
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
			stopped = b[i+2] == 'T' || b[i+2] == 't'
		}
		switch {
		case !stopped:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= s.frozenAfter:
			s.breakOff(cancel, fmt.Errorf("%w for %v", errParentFrozen, s.frozenAfter))
			return
		}
	}
}

func transportName(t collective.Transport) string {
	if t == collective.Auto {
		return "auto"
	}
	return string(t)
}

func (s *sidecar) reply(r pyResp) error {
	b, err := encodeFrame(r)
	if err != nil {
		return err
	}
	if _, err := s.out.Write(b); err != nil {
		return err
	}
	return s.out.Flush()
}

// sidecarReasons are the reasons of collective's sentinels, for the
// replies (Python raises the matching exception class).
var sidecarReasons = []struct {
	err    error
	reason string
}{
	{collective.ErrBroken, "collective.broken"},
	{collective.ErrClosed, "collective.closed"},
	{collective.ErrAborted, "collective.aborted"},
	{collective.ErrPeerLost, "collective.peer_lost"},
	{collective.ErrMismatch, "collective.mismatch"},
	{collective.ErrArgument, "collective.argument"},
	{collective.ErrNoSpace, "collective.no_space"},
	{collective.ErrWaited, "collective.waited"},
	{collective.ErrNoAdjoint, "collective.no_adjoint"},
	{collective.ErrConfig, "collective.config"},
	{collective.ErrUnauthenticated, "collective.unauthenticated"},
	{collective.ErrJoin, "collective.join"},
}

// errResp is err as a reply: its rpc code, its reason, its message.
func errResp(err error) pyResp {
	code := rpc.CodeOf(err)
	// The Python exception says its code: the message does not again.
	r := pyResp{Code: int(code), Msg: strings.TrimPrefix(err.Error(), "rpc: "+code.String()+": ")}
	for _, sr := range sidecarReasons {
		if errors.Is(err, sr.err) && rpc.CodeOf(sr.err) == code {
			r.Reason = sr.reason
			break
		}
	}
	var re *rpc.Error
	if r.Reason == "" && errors.As(err, &re) {
		r.Reason = re.Reason
	}
	if r.Code == 0 {
		r.Code = int(rpc.Unknown)
	}
	return r
}

func (s *sidecar) replyErr(id int64, err error) {
	r := errResp(err)
	r.ID = id
	s.reply(r)
}

// argErr is a request the sidecar refuses before any rank is involved.
func argErr(format string, args ...any) pyResp {
	return pyResp{Code: int(rpc.InvalidArgument), Reason: "collective.argument", Msg: fmt.Sprintf(format, args...)}
}

// checkAt refuses a request's At that is not a place in the data file to
// start a tensor at (negative, not a multiple of 64, or past the file),
// and a negative Room.
func (s *sidecar) checkAt(req pyReq) error {
	if at := req.At; at < 0 || at%64 != 0 || at > int64(len(s.d.mem)) {
		return fmt.Errorf("%w: at %d: want a multiple of 64 within the data file's %d bytes", collective.ErrArgument, at, len(s.d.mem))
	}
	if req.Room < 0 {
		return fmt.Errorf("%w: room %d", collective.ErrArgument, req.Room)
	}
	return nil
}

// input is the request's tensor, over the data file's bytes from req.At
// (no copy).
func (s *sidecar) input(req pyReq) (*tensordict.Tensor, error) {
	if !req.Has {
		return nil, nil
	}
	dt, err := memmap.ParseDType(req.DType)
	if err != nil {
		return nil, err
	}
	n, err := memmap.NumBytes(dt, req.Shape)
	if err != nil {
		return nil, err
	}
	if int64(n) > int64(len(s.d.mem))-req.At {
		return nil, fmt.Errorf("%w: the input's %d bytes at %d are past the data file's %d", collective.ErrArgument, n, req.At, len(s.d.mem))
	}
	if req.Room > 0 && int64(n) > req.Room {
		// An in-place call writes its output over its input: past the
		// room it would write where the parent keeps other outputs.
		return nil, fmt.Errorf("%w: the input's %d bytes are more than its room's %d", collective.ErrArgument, n, req.Room)
	}
	return tensordict.FromBytes(dt, req.Shape, s.d.mem[req.At:req.At+int64(n):req.At+int64(n)])
}

// outputAt is the output of an Allreduce, Reduce or Bcast at req.OutAt
// (pipe 3): of the input's dtype and shape, a multiple of 64 within the
// data file, and the input itself or clear of it.
func (s *sidecar) outputAt(req pyReq, t *tensordict.Tensor) (*tensordict.Tensor, error) {
	switch req.Op {
	case "allreduce", "reduce", "bcast":
	default:
		return nil, fmt.Errorf("%w: out_at with %s (only allreduce, reduce and bcast take it)", collective.ErrArgument, req.Op)
	}
	if t == nil {
		return nil, fmt.Errorf("%w: out_at without an input", collective.ErrArgument)
	}
	b, _ := t.Bytes()
	at, n := *req.OutAt, int64(len(b))
	if at < 0 || at%64 != 0 || at > int64(len(s.d.mem))-n {
		return nil, fmt.Errorf("%w: out_at %d: want a multiple of 64 with the output's %d bytes within the data file's %d", collective.ErrArgument, at, n, len(s.d.mem))
	}
	if at == req.At {
		return t, nil
	}
	if at < req.At+n && req.At < at+n {
		return nil, fmt.Errorf("%w: out_at %d: the output's %d bytes overlap the input's at %d", collective.ErrArgument, at, n, req.At)
	}
	return tensordict.FromBytes(t.DType(), t.Shape(), s.d.mem[at:at+n:at+n])
}

// after is where outputs may start: after the input at at, 64-byte aligned.
func after(at int64, t *tensordict.Tensor) int64 {
	if t == nil {
		return at
	}
	b, _ := t.Bytes()
	return at + (int64(len(b))+63)&^63
}

// handle runs one request and returns its reply, and whether to stop.
func (s *sidecar) handle(req pyReq) (pyResp, bool) {
	if err := s.d.seen(req.Size); err != nil {
		return argErr("%v", err), false
	}
	if req.Op == "close" {
		return pyResp{}, true
	}
	// Quiet: an Isend's input must be where the Python rank keeps it
	// (Keep), since the rank's next call may fill the file's scratch
	// before this one has copied it.
	if req.Quiet && req.Op != "irecv" && (req.Op != "isend" || !req.Keep) {
		return argErr("%s: quiet is for irecv and a kept isend only", req.Op), false
	}
	if err := s.checkAt(req); err != nil {
		return errResp(err), false
	}
	ctx := s.ctx
	if d := callTimeout(req.Timeout); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if req.Op == "wait" {
		return s.wait(ctx, req), false
	}
	t, err := s.input(req)
	if err != nil {
		return errResp(err), false
	}
	op := collective.Op(req.Red)
	c := s.c
	var res *tensordict.Tensor // a result to copy out after the input
	inPlace := false           // the result is the input, at req.At
	out, outAt := t, req.At    // where allreduce, reduce and bcast write
	if req.OutAt != nil {
		if out, err = s.outputAt(req, t); err != nil {
			return errResp(err), false
		}
		outAt = *req.OutAt
	}
	switch req.Op {
	case "allreduce":
		err = c.AllreduceInto(ctx, out, t, op)
	case "reduce":
		err = c.ReduceInto(ctx, out, t, op, req.Root)
	case "bcast":
		if out != t && c.Rank() == req.Root {
			ob, _ := out.Bytes()
			ib, _ := t.Bytes()
			copy(ob, ib)
		}
		err = c.BcastInto(ctx, out, req.Root)
	case "gather":
		res, err = c.Gather(ctx, t, req.Axis, req.Root)
	case "allgather":
		res, err = c.Allgather(ctx, t, req.Axis)
	case "scatter", "alltoall", "reducescatter":
		var counts []int
		if counts, err = s.counts(ctx, req); err != nil {
			break
		}
		switch req.Op {
		case "scatter":
			res, err = c.Scatter(ctx, t, req.Axis, counts, req.Root)
		case "alltoall":
			res, err = c.Alltoall(ctx, t, req.Axis, req.Axis2, counts)
		default:
			res, err = c.ReduceScatter(ctx, t, op, req.Axis, counts)
		}
	case "barrier":
		err = c.Barrier(ctx)
		return s.done(err, nil, false, 0), false
	case "send":
		err = c.Send(ctx, t, req.Peer, req.Tag)
		return s.done(err, nil, false, 0), false
	case "recv":
		err, inPlace = c.Recv(ctx, t, req.Peer, req.Tag), true
	case "isend", "irecv":
		return s.start(req, t), false
	default:
		return argErr("unknown op %q", req.Op), false
	}
	if err != nil {
		return errResp(err), false
	}
	switch req.Op {
	case "allreduce", "reduce", "bcast":
		return s.done(nil, out, true, outAt), false
	}
	if inPlace {
		return s.done(nil, t, true, req.At), false
	}
	if res == nil {
		return pyResp{None: true}, false
	}
	return s.place(res, after(req.At, t), req), false
}

// maxTimeoutMs is the largest request timeout, in milliseconds, that a
// time.Duration holds (about 292 years).
const maxTimeoutMs = int64(math.MaxInt64 / time.Millisecond)

// callTimeout is the bound of a call whose request says timeout ms: 0 (no
// bound) when ms is not positive, and when it is past maxTimeoutMs, which
// a Python rank's "forever" (timeout=1e10 s, sent as int(timeout*1000))
// is: multiplied unchecked it would wrap to a negative duration, the call
// would start past its deadline, and this rank would break the
// communicator off for every rank.
func callTimeout(ms int64) time.Duration {
	if ms <= 0 || ms > maxTimeoutMs {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// counts resolves a split's counts: given, or from every rank's numelem
// (an Allgather of one int64 each, as mpi4torch takes them), or nil.
func (s *sidecar) counts(ctx context.Context, req pyReq) ([]int, error) {
	if req.Numelem == nil {
		return req.Counts, nil
	}
	one, err := tensordict.Zeros(memmap.Int64, 1)
	if err != nil {
		return nil, err
	}
	b, _ := one.Bytes()
	binary.LittleEndian.PutUint64(b, uint64(int64(*req.Numelem)))
	all, err := s.c.Allgather(ctx, one, 0)
	if err != nil {
		return nil, err
	}
	ab, _ := all.Bytes()
	counts := make([]int, len(ab)/8)
	for i := range counts {
		counts[i] = int(int64(binary.LittleEndian.Uint64(ab[8*i:])))
	}
	return counts, nil
}

// place copies res into the data file at off (growing it) and describes it.
// Where res does not fit in req's Room (the bytes from req.At the parent
// lets the call write), it goes at the file's end instead, past anything
// the parent keeps in the file.
func (s *sidecar) place(res *tensordict.Tensor, off int64, req pyReq) pyResp {
	b, err := res.Bytes()
	if err != nil {
		return errResp(err)
	}
	if req.Room > 0 && off+int64(len(b)) > req.At+req.Room {
		off = (int64(len(s.d.mem)) + 63) &^ 63
	}
	if err := s.d.ensure(off + int64(len(b))); err != nil {
		return errResp(err)
	}
	copy(s.d.mem[off:], b)
	return s.done(nil, res, true, off)
}

func (s *sidecar) done(err error, t *tensordict.Tensor, out bool, off int64) pyResp {
	if err != nil {
		return errResp(err)
	}
	if !out || t == nil {
		return pyResp{}
	}
	return pyResp{Out: true, Off: off, DType: t.DType().Name(), Shape: t.Shape()}
}

// start begins an Isend (of a copy of the input: the data file is the
// next call's) or an Irecv (into Go memory until its Wait); with req.Keep,
// of the input where it is in the data file, or into the file at req.At,
// which the Python rank leaves alone until the Wait.
func (s *sidecar) start(req pyReq, t *tensordict.Tensor) pyResp {
	if req.ID == 0 {
		return argErr("%s without an id", req.Op)
	}
	if _, dup := s.reqs[req.ID]; dup {
		return argErr("%s: id %d is pending already", req.Op, req.ID)
	}
	if t == nil {
		return argErr("%s without a tensor", req.Op)
	}
	p := &pending{recv: req.Op == "irecv", kept: req.Keep, at: req.At}
	own := t
	if req.Keep {
		s.d.holds++
	} else {
		b, _ := t.Bytes()
		p.buf = s.bufs.take(len(b))
		if req.Op == "isend" {
			copy(p.buf, b)
		}
		var err error
		if own, err = tensordict.FromBytes(t.DType(), t.Shape(), p.buf); err != nil {
			return errResp(err)
		}
	}
	if p.recv {
		p.r = s.c.Irecv(s.ctx, own, req.Peer, req.Tag)
	} else {
		p.r = s.c.Isend(s.ctx, own, req.Peer, req.Tag)
	}
	s.reqs[req.ID] = p
	return pyResp{}
}

// wait completes an Isend or Irecv; an Irecv's tensor comes back at req.At.
func (s *sidecar) wait(ctx context.Context, req pyReq) pyResp {
	p, ok := s.reqs[req.Req]
	if !ok {
		return pyResp{Code: int(rpc.FailedPrecondition), Reason: "collective.waited",
			Msg: fmt.Sprintf("wait: request %d is not pending (waited for already, or never started)", req.Req)}
	}
	delete(s.reqs, req.Req)
	if err := p.r.Wait(ctx); err != nil {
		// Its buffer is dropped, and a kept request's hold stays (its old
		// mappings with it): the request may still be using them, and the
		// Python rank keeps its bytes in the file from reuse.
		return errResp(err)
	}
	if p.kept {
		s.d.release()
		if p.recv {
			return s.done(nil, p.r.Tensor(), true, p.at) // where it arrived
		}
		return pyResp{}
	}
	defer s.bufs.put(p.buf) // done with it once placed
	if !p.recv {
		return pyResp{}
	}
	return s.place(p.r.Tensor(), req.At, req)
}
