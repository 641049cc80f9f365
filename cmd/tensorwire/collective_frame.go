package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// The pipe protocol between a Python rank and its sidecar, "tensorwire
// collective rank" (docs/protocol.md, "Collective sidecar pipe"): frames
// on the sidecar's stdin (requests) and stdout (replies), each a 4-byte
// big-endian length and that many bytes of one msgpack map. The map keys
// are the fields' names below, in that (sorted) order, zero values left
// out; tensors' bytes never cross the pipe: they are in the data file
// both processes map (the request's input from offset At, the reply's
// output at Off).

// pipeVersion is the pipe protocol this sidecar speaks, told in its hello
// (pyResp.Pipe): 2 takes a request's At and Room; a hello without it is
// version 1, whose sidecar reads every input at offset 0 and ignores both,
// so a Python rank sends them only to a sidecar that says 2. 3 takes a
// request's OutAt: an Allreduce, Reduce or Bcast whose input the Python
// rank keeps (a tensor of comm.alloc, or an earlier output still in the
// file) writes its output there instead of over the input. 4 takes an
// Isend's and Irecv's Keep: the tensor where it is in the data file, which
// the Python rank leaves alone until the Wait (no copy on either side). 5
// takes an Isend's and Irecv's Quiet: no reply unless it fails, so that
// the Python rank goes on at once (its Wait's reply says the rest).
const pipeVersion = 5

// maxFrame bounds a frame: a description with every rank's counts
// (collective.MaxSize of them) fits many times.
const maxFrame = 1 << 20

// errFrame marks bytes on the pipe that are not a frame: the sidecar
// answers with it and stops.
var errFrame = errors.New("collective sidecar: bad frame")

// pyReq is one request from the Python rank.
type pyReq struct {
	At      int64  `codec:"at,omitempty"`      // where the input is in the data file (a multiple of 64); outputs at or after it
	Axis    int    `codec:"axis,omitempty"`    // Gather, Allgather, Scatter, ReduceScatter; Alltoall's gather axis
	Axis2   int    `codec:"axis2,omitempty"`   // Alltoall's scatter axis
	Counts  []int  `codec:"counts,omitempty"`  // every rank's count along the split axis
	DType   string `codec:"dtype,omitempty"`   // the input's dtype, torch's name without "torch."
	Has     bool   `codec:"has,omitempty"`     // an input tensor is at offset 0 of the data file
	ID      int64  `codec:"id,omitempty"`      // the request's number, echoed in its reply; Isend and Irecv's handle
	Keep    bool   `codec:"keep,omitempty"`    // pipe 4, isend and irecv: the tensor is the data file's bytes at At until the Wait
	Numelem *int   `codec:"numelem,omitempty"` // instead of Counts, this rank's count (mpi4torch's numelem)
	Op      string `codec:"op,omitempty"`      // the call: allreduce, bcast, ..., isend, irecv, wait, close
	OutAt   *int64 `codec:"out_at,omitempty"`  // pipe 3, allreduce, reduce and bcast: the output here, not over the input at At
	Peer    int    `codec:"peer,omitempty"`    // Send/Recv: the other rank
	Quiet   bool   `codec:"quiet,omitempty"`   // pipe 5, isend and irecv: no reply unless the start fails
	Red     int    `codec:"red,omitempty"`     // the reduction, collective.Op's value (1 Sum ... 10 BXor)
	Req     int64  `codec:"req,omitempty"`     // wait: the ID of the Isend or Irecv
	Room    int64  `codec:"room,omitempty"`    // the bytes from At the call may write (0: to the file's end and past it)
	Root    int    `codec:"root,omitempty"`
	Shape   []int  `codec:"shape,omitempty"`   // the input's shape (nil: a scalar)
	Size    int64  `codec:"size,omitempty"`    // the data file's size as the Python rank has made it
	Tag     int    `codec:"tag,omitempty"`     // Send/Recv
	Timeout int64  `codec:"timeout,omitempty"` // milliseconds the call may take (0, or past what a time.Duration holds: no bound; callTimeout)
}

// pyResp is the sidecar's reply to one request (or, with ID 0, its hello
// after joining: Rank, Size and Transport).
type pyResp struct {
	Code      int    `codec:"code,omitempty"` // 0: success; else the rpc code of the error
	DType     string `codec:"dtype,omitempty"`
	ID        int64  `codec:"id,omitempty"`
	Msg       string `codec:"msg,omitempty"`  // the error's message
	None      bool   `codec:"none,omitempty"` // no output on this rank (Gather off the root)
	Off       int64  `codec:"off,omitempty"`  // where the output starts in the data file
	Out       bool   `codec:"out,omitempty"`  // an output tensor is at Off
	Pipe      int    `codec:"pipe,omitempty"` // the pipe protocol's version (hello; pipeVersion)
	Rank      int    `codec:"rank,omitempty"`
	Reason    string `codec:"reason,omitempty"` // the error's reason (collective.mismatch, ...)
	Shape     []int  `codec:"shape,omitempty"`
	Size      int64  `codec:"size,omitempty"` // the data file's size now (the sidecar grew it when larger)
	Transport string `codec:"transport,omitempty"`
	World     int    `codec:"world,omitempty"` // the communicator's size (hello)
}

var pyHandle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.RawToString = true
	h.MaxDepth = 8
	return h
}()

// encodeFrame returns v as one frame: its length, then its msgpack map.
func encodeFrame(v any) ([]byte, error) {
	var body []byte
	if err := codec.NewEncoderBytes(&body, pyHandle).Encode(v); err != nil {
		return nil, err
	}
	if len(body) > maxFrame {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errFrame, len(body), maxFrame)
	}
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body))), body...), nil
}

// decodeReq decodes one request's msgpack map (a frame's body), which must
// be the whole of b.
func decodeReq(b []byte) (pyReq, error) {
	var r pyReq
	dec := codec.NewDecoderBytes(b, pyHandle)
	if err := dec.Decode(&r); err != nil {
		return pyReq{}, fmt.Errorf("%w: %v", errFrame, err)
	}
	if dec.NumBytesRead() != len(b) {
		return pyReq{}, fmt.Errorf("%w: %d bytes after the request", errFrame, len(b)-dec.NumBytesRead())
	}
	if len(r.Shape) > 64 {
		return pyReq{}, fmt.Errorf("%w: %d dimensions", errFrame, len(r.Shape))
	}
	return r, nil
}

// readFrame reads one frame's body from r. io.EOF: the pipe closed between
// frames (the Python rank is gone).
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return nil, fmt.Errorf("%w: length %d, at most %d", errFrame, n, maxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%w: %v", errFrame, err)
	}
	return b, nil
}
