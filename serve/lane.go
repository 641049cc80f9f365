package serve

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// The lane: an attached replica's batches and answers through two FIFOs in
// its folder, beside the serve.replica stream (replica.go).
//
// A replica that shares the node's page cache has its rows in its folder
// already (by reference), so a batch is only (batch, row, n) and an
// answer (batch, version, error). Through the stream each costs a msgpack
// message in a yamux frame on TCP, which is most of what a Python replica
// does per batch when its module is quick (70% of a null module's time
// outside its wait, under cProfile: about 0.2 ms a batch) against a few
// microseconds for a read and a write of fixed frames on a pipe. So a replica that asks for a lane (replicaRequest.Lane) makes two
// FIFOs in its folder, "batches" and "answers", and holds both open (the
// batches one for reading, the answers one for reading and writing, so
// that neither open waits for the node); the node opens the batches one
// for writing and the answers one for reading, and says so with a first
// stream message of batch 0 (laneAck). From then on the node writes each
// batch as a batch frame into "batches" and reads the answers, in the
// order sent, as answer frames from "answers"; nothing more travels on the
// stream but its end. A node that cannot open them (not FIFOs, a
// filesystem without them) sends no laneAck and uses the stream, and so
// does a node from before lanes, which ignores the request's key: the
// replica takes whatever comes first.
//
// Frames, little-endian, each written whole by one write (a pipe writes up
// to PIPE_BUF, 4096 bytes, at once, so a reader never sees half a frame
// from a writer that died mid-write):
//
//	batch  (16 bytes): batch uint64, row uint32, n uint32
//	answer (24 bytes + error): batch uint64, version uint64,
//	       error length uint32 (at most maxLaneError), zero uint32,
//	       then the error's UTF-8 bytes ("" for outputs in the out rows)
//
// The ends say when the other side went away: the node reads EOF from
// "answers" when the replica's process is gone (it holds the only write
// end), the replica EOF from "batches" when the node closed its end (the
// node detached it, or died). Either way the stream ends too, and the
// replica attaches again with fresh FIFOs (made anew for each stream, so
// that nothing left in one from the last stream is read in the next).
// docs/protocol.md, "serve.replica lanes", has the frames' bytes.

const (
	laneBatches    = "batches"
	laneAnswers    = "answers"
	laneBatchSize  = 16
	laneAnswerSize = 24
	// maxLaneError bounds an answer's error, so that the frame is one
	// atomic pipe write; a replica cuts a longer message.
	maxLaneError = 4096 - laneAnswerSize
)

// errLaneClosed is a lane's end read by the node: the replica closed its
// write end of "answers" (it closed the lane, or its process is gone).
var errLaneClosed = errors.New("serve: the replica's lane ended")

// laneAck is the stream message by which the node says it took the lane:
// batch 0, which no batch is.
var laneAck = replicaBatch{}

// lane is the node's end of a replica's lane: send is called under
// attachedStream.smu, recv by one reader goroutine; close ends both.
type lane struct {
	batches *os.File // write end
	answers *os.File // read end
	r       *bufio.Reader
	buf     [laneBatchSize]byte // send's frame (under smu)
}

// openLane opens the FIFOs of the replica's folder dir: batches for
// writing, answers for reading, neither waiting (O_NONBLOCK: the replica
// holds the other ends open already, and a batches FIFO it does not hold
// is an error, ENXIO, not a wait). Anything there that is not a FIFO is an
// error: the lane is not taken.
func openLane(dir *os.Root) (*lane, error) {
	open := func(name string, flag int) (*os.File, error) {
		if fi, err := dir.Lstat(name); err != nil {
			return nil, err
		} else if fi.Mode().Type() != fs.ModeNamedPipe {
			return nil, fmt.Errorf("%s is not a FIFO (%v)", name, fi.Mode().Type())
		}
		f, err := dir.OpenFile(name, flag|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, err
		}
		if fi, err := f.Stat(); err != nil || fi.Mode().Type() != fs.ModeNamedPipe {
			f.Close()
			return nil, fmt.Errorf("%s is not a FIFO once opened", name)
		}
		return f, nil
	}
	b, err := open(laneBatches, os.O_WRONLY)
	if err != nil {
		return nil, err
	}
	a, err := open(laneAnswers, os.O_RDONLY)
	if err != nil {
		b.Close()
		return nil, err
	}
	return &lane{batches: b, answers: a, r: bufio.NewReaderSize(a, 4096)}, nil
}

// putLaneBatch writes a batch frame into b (laneBatchSize bytes).
func putLaneBatch(b []byte, batch uint64, row, n int) {
	binary.LittleEndian.PutUint64(b[0:], batch)
	binary.LittleEndian.PutUint32(b[8:], uint32(row))
	binary.LittleEndian.PutUint32(b[12:], uint32(n))
}

// parseLaneAnswer reads an answer frame's header: its batch, version and
// error length, or why the frame is not one.
func parseLaneAnswer(h []byte) (batch, version uint64, errLen int, err error) {
	if len(h) < laneAnswerSize {
		return 0, 0, 0, fmt.Errorf("an answer frame of %d bytes; want %d", len(h), laneAnswerSize)
	}
	batch = binary.LittleEndian.Uint64(h[0:])
	version = binary.LittleEndian.Uint64(h[8:])
	n := binary.LittleEndian.Uint32(h[16:])
	if z := binary.LittleEndian.Uint32(h[20:]); z != 0 {
		return 0, 0, 0, fmt.Errorf("an answer frame with %#x where zero is", z)
	}
	if n > maxLaneError {
		return 0, 0, 0, fmt.Errorf("an answer frame with an error of %d bytes; at most %d", n, maxLaneError)
	}
	return batch, version, int(n), nil
}

// send writes the batch's frame. It never waits on a full pipe: the node
// keeps at most maxWindow frames unanswered, far below a pipe's 64 KiB.
// A replica gone fails it (EPIPE: Go returns it rather than die of
// SIGPIPE on a descriptor other than stdout's).
func (l *lane) send(batch uint64, row, n int) error {
	putLaneBatch(l.buf[:], batch, row, n)
	_, err := l.batches.Write(l.buf[:])
	return err
}

// recv reads the next answer: errLaneClosed at the answers' end (EOF at
// a frame's start), else the frame's error.
func (l *lane) recv() (replicaAnswer, error) {
	var h [laneAnswerSize]byte
	if _, err := io.ReadFull(l.r, h[:]); err != nil {
		if err == io.EOF {
			return replicaAnswer{}, errLaneClosed
		}
		return replicaAnswer{}, fmt.Errorf("the replica's lane: %w", err)
	}
	batch, version, n, err := parseLaneAnswer(h[:])
	if err != nil {
		return replicaAnswer{}, err
	}
	ans := replicaAnswer{Batch: batch, Version: version}
	if n > 0 {
		e := make([]byte, n)
		if _, err := io.ReadFull(l.r, e); err != nil {
			return replicaAnswer{}, fmt.Errorf("the replica's lane, an answer's error: %w", err)
		}
		ans.Error = string(e)
	}
	return ans, nil
}

// close closes both ends; a recv waiting returns.
func (l *lane) close() {
	l.batches.Close()
	l.answers.Close()
}
