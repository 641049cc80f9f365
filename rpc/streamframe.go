package rpc

import (
	"fmt"
	"io"
)

// streamHeader heads each frame of a message stream after its open request
// (docs/protocol.md, "Streams"): a message, whose argument and body follow
// as in a call, or the end of the sender's messages, with a status.
type streamHeader struct {
	ArgLen  int64 // a message's msgpack bytes
	BodyLen int64 // a message's body bytes on the wire
	RawLen  int64 // > 0: the body is an LZ4 frame of this many bytes

	End     bool  // the sender's last frame
	Code    uint8 // of an end: 0 when the sender ended normally
	Message string
	Reason  string
}

// appendMsgpack encodes h with its keys sorted, leaving out those a frame
// of its kind does not use: a message is {arg_len, body_len[, raw_len]}, an
// end {code, end, message[, reason]}.
func (h *streamHeader) appendMsgpack(b []byte) []byte {
	if h.End {
		b = append(b, 0x80|byte(3+btoi(h.Reason != "")))
		b = appendStr(b, "code")
		b = appendInt(b, int64(h.Code))
		b = appendStr(b, "end")
		b = append(b, 0xc3)
		b = appendStr(b, "message")
		b = appendStr(b, h.Message)
		if h.Reason != "" {
			b = appendStr(b, "reason")
			b = appendStr(b, h.Reason)
		}
		return b
	}
	b = append(b, 0x80|byte(2+btoi(h.RawLen != 0)))
	b = appendStr(b, "arg_len")
	b = appendInt(b, h.ArgLen)
	b = appendStr(b, "body_len")
	b = appendInt(b, h.BodyLen)
	if h.RawLen != 0 {
		b = appendStr(b, "raw_len")
		b = appendInt(b, h.RawLen)
	}
	return b
}

// decodeMsgpack decodes any valid encoding of the header's map, skipping
// keys it does not know, and refuses a frame that mixes the two kinds: an
// end with a payload, or a message with a status.
func (h *streamHeader) decodeMsgpack(b []byte) error {
	d := headerReader(b)
	for d.next() {
		switch string(d.key) {
		case "arg_len":
			h.ArgLen = d.int()
		case "body_len":
			h.BodyLen = d.int()
		case "raw_len":
			h.RawLen = d.int()
		case "end":
			h.End = d.bool()
		case "code":
			c := d.int()
			if c < 0 || c > 255 {
				d.fail("code %d", c)
			}
			h.Code = uint8(c)
		case "message":
			h.Message = d.str()
		case "reason":
			h.Reason = d.str()
		default:
			d.skip()
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	if h.End && (h.ArgLen != 0 || h.BodyLen != 0 || h.RawLen != 0) {
		return fmt.Errorf("%w: stream end with a payload", errProtocol)
	}
	if !h.End && (h.Code != 0 || h.Message != "" || h.Reason != "") {
		return fmt.Errorf("%w: stream message with a status", errProtocol)
	}
	return nil
}

// endHeader returns the end frame for status: io.EOF or nil for a normal
// end, else the error's code, message and (when well formed) reason.
func endHeader(status error) streamHeader {
	h := streamHeader{End: true}
	if status == nil || status == io.EOF {
		return h
	}
	e := asError(status)
	h.Code, h.Message = uint8(e.Code), truncate(e.Msg, maxMessage)
	if validReason(e.Reason) {
		h.Reason = e.Reason
	}
	return h
}

// status returns what an end frame says: io.EOF for a normal end, else the
// sender's error.
func (h *streamHeader) status() error {
	if h.Code == uint8(OK) {
		return io.EOF
	}
	return &Error{Code: Code(h.Code), Reason: h.Reason, Msg: h.Message}
}
