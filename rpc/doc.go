// Package rpc lets nodes call each other's functions on TensorDicts, shipping
// references to memory-mapped files instead of their bytes when the nodes
// share a filesystem, and the bytes when they do not.
//
// A node is a Server: handlers registered by name with typed requests and
// responses (Register), served on a listener (Serve). A caller is a Client
// (Dial), which calls them synchronously (Call) or asynchronously (Go).
// Requests and responses are structs encoded with msgpack; a TD field in
// them carries a TensorDict, as a reference (file path under the shared
// root, dtype, shape, view) when both sides share the root's filesystem
// identity (ReadFSID), and as raw bytes after the message otherwise. Every
// Server also serves fill, read and describe (Client.Fill, Client.Read,
// Client.ReadInto, Client.Describe).
//
// A message stream (RegisterStream, OpenStream) is a call that carries
// typed messages both ways for as long as its handler runs, TDs in them as
// in calls; a slow receiver holds back its own sender through the stream's
// window, and either side's cancellation or death ends the other's.
// Bytes-mode bodies travel lz4-compressed when a sample shows it pays
// (WithCompression, Uncompressed). A handler that would write a request's
// bytes to disk anyway can have them written into files as they arrive
// (PlaceBytes), so that receiving and writing overlap; a caller that
// receives batches of one layout call after call can have them read into
// TensorDicts it holds (CallInto), so that no batch is allocated.
//
// Connections start with a handshake (magic, version, an HMAC-SHA256
// challenge-response when a token is configured, each side's filesystem
// identity), optionally inside TLS, then carry a yamux session whose
// streams carry the calls. A call that may move a large body (256 KiB or
// more, either way) goes around yamux, whole, on a side connection: a
// further TCP connection that authenticates as the first and that one call
// or message stream holds at a time (WithSideConnections,
// Limits.MaxSideConns). docs/protocol.md specifies the bytes.
//
// Every call has the caller's deadline, and the handler's context ends
// when the caller cancels or goes away. Errors carry gRPC's codes (Code,
// *Error) and match with errors.Is (ErrInvalidArgument and the like); a
// service's own sentinel errors cross the wire as a code and a reason and
// match errors.Is on the caller's side (RegisterReason).
// A Server bounds what each peer may send (Limits) and keeps serving the
// others when one misbehaves.
package rpc

// Empty is a request or response with no fields.
type Empty struct{}
