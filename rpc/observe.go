package rpc

import (
	"reflect"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
)

// Observer is told of every call and message stream a Server answers: what
// a metrics exporter counts (WithObserver). Observe runs on the goroutine
// that served the call, after its answer is written (a stream's, after the
// stream ends), so it must be quick and must not block; it may be called
// from many goroutines at once.
//
// The interface keeps the rpc package free of any metrics library:
// tensorwire's node wires it to Prometheus (internal/metrics), a test or
// another program to whatever it counts with.
type Observer interface {
	Observe(Observation)
}

// Observation is one call or message stream a Server answered.
type Observation struct {
	// Method is the method called, or "" when the server has none of that
	// name: a peer chooses the names it sends, and an observer that keys
	// figures by method must not be handed unbounded ones.
	Method string
	// Request is the decoded request, a pointer to the handler's Req (a
	// stream's opening request), or nil when it was not decoded (a refused
	// or malformed call). It is the server's: read it during Observe, and
	// do not keep it or its TDs.
	Request  any
	Stream   bool          // a message stream (RegisterStream), not a call
	Code     Code          // OK, or the code of the error the caller got
	Duration time.Duration // from the request's header read to the answer written; a stream's whole life
	// BytesIn and BytesOut are the request's and the answer's bodies as they
	// crossed the wire (compressed when they were), TDs sent by value; a
	// stream's BytesIn is its opening request's, its messages are not counted.
	BytesIn, BytesOut int64
	// RefBytesIn is the bytes of the tensor views the request's TDs named
	// by reference, which did not cross the wire: the rows named (TD.Rows),
	// or the whole views. Answers never carry references.
	RefBytesIn int64
}

// WithObserver has a Server tell obs of every call and message stream it
// answers (Observation). Server only.
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

// observe tells the server's observer, if any, of the call in; code and
// bytesOut are its answer's.
func (s *Server) observe(in *incoming, code Code, bytesOut int64, stream bool) {
	obs := s.o.observer
	if obs == nil {
		return
	}
	o := Observation{Request: in.req, Stream: stream, Code: code, Duration: time.Since(in.start),
		BytesIn: in.bodyIn, BytesOut: bytesOut}
	if in.known {
		o.Method = in.method
	} else {
		// Refused before its handler was looked up (too many calls, a
		// body the budget refused): named when the method exists.
		s.mu.RLock()
		if s.registered(in.method) {
			o.Method = in.method
		}
		s.mu.RUnlock()
	}
	if in.req != nil {
		for _, td := range findTDs(reflect.ValueOf(in.req).Elem(), nil) {
			if td.TensorDict != nil { // built: its references were checked against their files
				o.RefBytesIn += td.wire.refBytes()
			}
		}
	}
	obs.Observe(o)
}

// refBytes returns the bytes of the tensor views w names by reference:
// of its rows (Rows) when it names some, else of the whole views.
func (w *wireTD) refBytes() int64 {
	if w == nil {
		return 0
	}
	var n int64
	for _, e := range w.Entries {
		if e.Ref == nil || e.Kind != kindTensor {
			continue
		}
		dt, err := memmap.ParseDType(e.DType)
		if err != nil {
			continue
		}
		b := int64(dt.Size())
		for _, d := range e.Shape {
			b *= int64(d)
		}
		n += b
	}
	if len(w.Rows) > 0 && !w.Gathered && len(w.Batch) > 0 && w.Batch[0] > 0 {
		n = n / int64(w.Batch[0]) * int64(len(w.Rows))
	}
	return n
}
