// Package store is a store of named bins of TensorDicts and of versioned
// parameter sets, after tensorshare: many processes and machines put
// TensorDicts into bins and take them out, watch them change, and share
// network parameters for distributed reinforcement learning, joining,
// dropping and coming back at any time.
//
// A bin holds a list of items, each a TensorDict (with NonTensor values,
// such as a version number). Put replaces a bin's content with one item;
// Append adds one (an empty bin takes it as its only item), Extend several
// as one operation (torchrl's extend: one revision, all or none); Get returns
// every item and removes them; Peek returns them and keeps them; List
// counts the items of each bin; Delete removes a bin. A parameter set is a
// sequence of versions: Publish adds version v+1, Latest returns the
// newest, WaitNewer waits for one newer than v. Trainer and Worker are
// tensorshare's RLTrainer and RLWorker on top: rollouts tagged with the
// version of the parameters that made them, drained by a trainer that
// keeps only those of its latest version.
//
// A Store lives in a folder (Open) and is served by one process, a node
// (Register, Service.Add, "tensorwire node --store NAME"); other processes
// Dial it and make the same calls (API). Many calls may be in flight on one
// client. Clients that share the node's filesystem move large values by
// reference: a value is written once into a prefix (a tensordict memmap
// folder) that the node renames into place, and readers map it read-only;
// nobody downloads it. Elsewhere the same calls carry bytes.
//
// # Guarantees
//
// Every Put, Append, Extend, acknowledged Get, Delete and Publish is a
// record in the store's log, written (and fsynced, unless Options.NoSync)
// before the call returns; many calls share one fsync. A node killed at
// any moment reopens with every operation it acknowledged, in their order,
// and nothing it did not finish: a torn record at the log's end is cut
// off, damage before good records refuses to open (ErrCorrupt). Values too
// large to keep inline are written into a prefix, flushed and renamed into
// place before the record naming them, so a crash leaves a value whole or
// absent.
//
// A remote Get removes its items only once the caller has them: the node
// holds them for the caller, who acknowledges them once received or
// mapped; items never acknowledged go back to the bin after
// Options.GetTimeout. Retried calls (after a lost reply, or a node restart)
// are recognised by their ids and never applied twice, so an item appended
// once is drained once.
//
// Every change is an Event with the store's revision, numbered without gaps
// across restarts. Watch delivers them in order, durable ones only; a
// watcher that reconnects resumes after its last revision, and one whose
// revision is no longer kept gets ErrCompacted (etcd's contract): nothing
// is missed silently. Events ride the watcher's own connection.
//
// A parameter version is never deleted while a reader holds a lease on it;
// a reader that dies stops renewing, its lease runs out, and the node
// deletes the version once a newer one is durable. A deleted value (a
// version, a Get's or Delete's item) waits in the store's trash/ folder for
// Options.TrashGrace before it is unlinked, for readers on other machines
// that still map it; a client on another machine (rpc.Storage sharing) has
// Get and Peek copy large items instead of mapping them, since a Get's
// items are the caller's to keep.
//
// # Files removed or foreign
//
// A store deletes only what it made, inside its folder: Open refuses a
// folder that holds files but is not a store (ErrExists), a store's folder
// whose own files or folders are symbolic links (ErrExists, naming the
// link), and a store's folder whose log was deleted (ErrLost), touching
// nothing; it reaches its folders through an os.Root. A running store
// whose log is deleted or replaced, or whose folder is removed, stops
// acknowledging: every call fails with ErrLost, and it logs why once at
// ERROR (Options.Logger). A value's folder deleted under the store costs
// that value only: its item or version is lost (ErrMissing when read), the
// rest is read as ever. What the log and the folder disagree on (lost
// items, values no record names) Open reports and leaves; Options.Repair
// drops it, saying what.
//
// docs/store.md in the repository describes the files, the protocol and
// what happens when a process dies.
package store
