package rpc

import (
	"sync"
	"sync/atomic"
)

// Seal is the compressed body of one TensorDict's bytes, made by the first
// stream message that sends them and written as it is by every later one:
// a node sending one batch to N streams by bytes compresses it once, not N
// times. Put it in the TD (TD.Seal) of a message sent with Stream.Send or
// ServerStream.Send, where that TD is the message's only one; the frame
// on the wire is the one each message would have had (docs/protocol.md,
// "Compression": nothing changes for the peer). A stream that does not
// compress (the peer did not ask, or the context says Uncompressed) sends
// the bytes as they are and leaves the seal alone.
//
// The seal belongs to the bytes, not the TD value: the TensorDict's bytes
// must not change while a message carrying the seal is being sent, and
// Reset must be called before they change (the memory reused for other
// data) and after every such send has returned. A seal made for a body of
// another length is made again. The zero value is ready; sends may share a
// seal concurrently (the first compresses, the others wait for it), Reset
// may not run concurrently with them.
type Seal struct {
	mu   sync.Mutex
	made bool
	raw  int64  // the body's bytes when made
	z    []byte // its LZ4 frame; nil: it does not compress, or could not be read
	zok  bool
}

// Reset forgets the compressed body, keeping its memory for the next one.
func (s *Seal) Reset() {
	s.mu.Lock()
	s.made, s.raw, s.zok = false, 0, false
	s.z = s.z[:0]
	s.mu.Unlock()
}

// sealsMade counts the bodies seals compressed (tests).
var sealsMade atomic.Int64

// body returns the outgoing body of parts, compressed through the seal:
// the frame made by the first call (this one, or an earlier one) when the
// body compresses. The frame stays the seal's (outBody.shared).
func (s *Seal) body(parts []bodyPart) outBody {
	b := outBody{parts: parts, raw: bodySize(parts)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.made || s.raw != b.raw {
		// After Reset (or at first) no send holds the frame's memory, which
		// is used again; a body of another length may be made while sends
		// of the old one still write theirs, so it gets memory of its own.
		dst := s.z[:0]
		if s.made {
			dst = nil
		}
		s.made, s.raw, s.zok = true, b.raw, false
		if b.raw >= lz4MinBody && samplePays(parts, b.raw) {
			if z := compressPartsInto(parts, dst); z != nil {
				s.z, s.zok = z, true
				sealsMade.Add(1)
			}
		}
	}
	if s.zok {
		z := s.z // this frame, whatever the seal holds later
		b.z, b.shared = &z, true
	}
	return b
}
