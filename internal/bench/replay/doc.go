// Package replaybench is the distributed replay-buffer benchmark,
// "tensorwire bench replay": a buffer node, writers and a trainer, each a
// process of its own, working on one replay buffer through replay.Client,
// first with the rows in the shared storage (mode "ref") and then with the
// rows travelling with the calls (mode "bytes").
//
//	tensorwire bench replay [--duration 20s] [--writers 2] [--capacity 50000]
//	    [--batch 64] [--sample-batch 256] [--min-size 1000] [--modes ref,bytes]
//	    [--root DIR] [--token-file F] [--json FILE]
//
// # The run
//
// Run makes a new shared root (a temporary folder, under --root if given;
// removed at the end, also after an error or Ctrl-C) and, for each mode in
// turn, starts these processes on this machine, the running program
// re-executed as "bench replay --role ROLE ...":
//
//	buffer   a node (nodeproc.Run) serving a new buffer at ROOT/bench-MODE:
//	         capacity 50,000, its storage created with the schema up front
//	         (1.41 GB), uniform sampler, round-robin writer,
//	         replay.RateLimit{MinSize: 1000}
//	writers  2: each Extends batches of 64 transitions, as fast as it can
//	trainer  1: SampleInto's batches of 256 into the same TensorDict, as
//	         fast as it can (the rate limiter holds it until 1,000 are in)
//
// Writers and trainer Dial with replay.WithRoot(ROOT); in bytes mode also
// with replay.WithBytes(). A transition is obs uint8 [84, 84, 4], action
// int64, reward float32 and done bool: 28,237 bytes (TransitionBytes).
// Each mode gets a new node process and a new prefix, removed after it, so
// modes share no state. A process that fails stops the mode and the run;
// a dying parent stops its children (their stdin closes: ChildContext).
//
// # Phases
//
// The buffer node paces each mode: it serves a barrier that the writers and
// the trainer call between phases, and each call returns once all have
// made it, so phases start at the same moment in every process:
//
//	warm-up  The writers write the capacity 4 times over (warmLaps): each
//	         writes its share, ceil(capacity/writers) transitions in whole
//	         batches, 4 times. The first lap writes every slot, so every
//	         page of the storage is in the page cache ("first fill s": the
//	         cold writes); the other laps map the pages into each writer's
//	         own mapping as well. Every figure after it is steady state: a
//	         full round-robin buffer overwriting its oldest transitions,
//	         pages resident and mapped. The trainer samples meanwhile,
//	         untimed, so its side is warm too. Reported: the slowest
//	         writer's times ("first fill s", "warm-up s").
//	memcpy   The writers wait. The trainer maps the storage itself,
//	         read-only, reads every page once, and then for
//	         --memcpy-duration (1.5 s) copies batches of 256 random rows of
//	         every leaf out of the mapping into Go buffers with copy(): the
//	         memcpy gather limit, a rate no sampler of this storage can beat.
//	timed    Everyone runs for --duration. The trainer polls the node's
//	         Stats every 500 ms for its Go heap.
//	done     The node checkpoints (reported: "checkpoint s"). The parent
//	         then stops it (SIGTERM): it checkpoints again, closes the
//	         buffer and exits.
//
// # Verification
//
// Every transition carries its id in every field (see idWriterShift for
// the encoding), and the trainer checks every row it is given, in the
// warm-up and in the timed phase: action, reward, done and the obs words at
// both ends of the row and every 256 bytes between must all name the same
// transition, one that a writer wrote. A row that fails is torn. Torn rows
// are counted and reported ("torn rows returned"; it must be 0), never
// dropped; the first few are logged.
//
// # What it reports
//
// A table on stdout, a column per mode:
//
//	inserted/s, sampled/s    transitions per second in the timed phase: the
//	                         sum of the writers' rates; the trainer's rate
//	insert/sample MB/s       the same times 28,237 bytes (MB = 1e6 bytes)
//	extend ms p50/p99        latency of Extend over every writer's calls
//	sample ms p50/p99        latency of SampleInto
//	buffer heap MB (max)     the largest Stats.NodeHeap polled
//	torn rows returned       rows the trainer got that were not whole
//	rows verified            rows the trainer checked, warm-up included
//	rows resampled           the node's count of rows sampled in the timed
//	                         phase minus those the trainer got: rows
//	                         replaced because a writer overwrote them while
//	                         they were read (by the trainer in ref mode, by
//	                         the node in bytes mode)
//	sampled / memcpy limit   sampled/s over the memcpy gather limit (goal
//	                         at least 0.5)
//	inserted / seed,         against the seed stack, torchrl over
//	sampled / seed           torch.distributed.rpc: 11,000 inserted/s and
//	                         15,000 sampled/s (goal at least 10)
//
// The memcpy gather limit is measured in each mode (before its timed
// phase); the run's limit, which the ratios use, is the best of them.
// Progress goes to stderr: the buffer node prints the mode, the phase, how
// long it has run and the rates over the last second, once a second.
//
// # JSON
//
// With --json FILE the figures are written (atomically) to FILE:
//
//	{"ref": {...}, "bytes": {...}, "memcpy_gather_transitions_per_s": N,
//	 "config": {...}}
//
// Each mode's object has insert_transitions_per_s, sample_transitions_per_s,
// extend_ms_p50, extend_ms_p99, sample_ms_p50, sample_ms_p99,
// buffer_heap_mb and torn_rows_returned, and more (modeFigures).
//
// # Roles on several hosts
//
// Each process can run by itself, on its own host, with --role. The buffer
// node holds the run's settings and paces it; the others need only its
// address, their mode and their batch size:
//
//	host A: tensorwire bench replay --role buffer --listen :7070 --root /mnt/shared \
//	            --token-file F [--capacity ... --min-size ... --writers 2 --duration 20s]
//	host B: tensorwire bench replay --role writer --addr hostA:7070 --root /mnt/shared --token-file F --mode ref
//	host C: tensorwire bench replay --role trainer --addr hostA:7070 --root /mnt/shared --token-file F --mode ref
//
// The buffer prints "listening on HOST:PORT" first (nodeproc's convention)
// and serves until SIGINT or SIGTERM, then checkpoints and closes the
// buffer. --name (default "replaybench") names the buffer and its folder
// under the root, which must not hold one yet. Every role prints its
// results as one line of JSON on stdout when it ends ({"role": ...}).
package replay
