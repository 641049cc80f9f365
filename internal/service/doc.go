// Package service is the floor the services on rpc (replay, store, serve,
// loader) stand on, so that what they share is written once:
//
//   - Registry: the things a node serves under names (replay's buffers,
//     store's stores, serve's models, loader's producers), with one rule
//     for a name given twice (AlreadyExists) and one for a name not served
//     (NotFound), and each thing's folder named relative to the server's
//     root (rpc.Server.Rel) when the service shares it by reference.
//   - Caller and Call: a client's call to its node, tried again while the
//     node is unreachable, with one retry policy: only Unavailable, after a
//     backoff with full jitter (internal/backoff), until the call's context
//     ends, and a method whose request may have reached the node only if
//     the service marked it repeatable (Methods), as etcd's client marks
//     its calls repeatable or not.
//   - Dialing: what every client's Dial takes alike (this side's root,
//     WithBytes, rpc's options), the one Dial with them, and the one rule
//     for working by reference (Mode): a root, an object under the node's
//     root, the sharing level the service needs (rpc.Coherent for files
//     rewritten in place, rpc.Storage for write-once files) and no
//     WithBytes. Sharing reports the level whatever WithBytes says.
//
// It is internal: each service keeps its own public names (its Service,
// its sentinels, its Client) and uses these underneath.
package service
