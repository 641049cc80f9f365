package store

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	storeapi "github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A role is one process of the run, started by the parent with --role. It
// prints "ready" (and an address, for servers) as its first line once it
// can be used, runs until its context ends (the parent closes its stdin or
// sends SIGTERM) or its work is done, and writes its result as JSON to
// --out.

const (
	storeName    = "bench"
	rolloutBin   = "rollouts"
	watchBin     = "watched"
	rolloutBytes = 28 << 10 // 28,672 bytes of observations per rollout item
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func runRole(_ context.Context, o *options) error {
	ctx, stop := nodeproc.ChildContext()
	defer stop()
	var res any
	var err error
	switch o.role {
	case "node":
		return roleNode(ctx, o)
	case "publisher":
		res, err = rolePublisher(ctx, o)
	case "reader":
		res, err = roleReader(ctx, o)
	case "tcp-relay":
		return roleRelay(ctx, o)
	case "tcp-publisher":
		res, err = roleTCPPublisher(ctx, o)
	case "tcp-reader":
		res, err = roleTCPReader(ctx, o)
	case "appender":
		res, err = roleAppender(ctx, o)
	case "drainer":
		res, err = roleDrainer(ctx, o)
	case "putter":
		res, err = rolePutter(ctx, o)
	case "watcher":
		res, err = roleWatcher(ctx, o)
	default:
		return fmt.Errorf("unknown role %q", o.role)
	}
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, b, 0o644)
}

// roleNode serves the store ROOT/bench, with default options (fsync before
// every acknowledgement) unless --sync none, and prints "ready ADDR".
func roleNode(ctx context.Context, o *options) error {
	s, err := storeapi.Open(filepath.Join(o.root, storeName), storeapi.Options{NoSync: o.noSync})
	if err != nil {
		return err
	}
	defer s.Close()
	return nodeproc.Run(ctx, nodeproc.Config{
		Listen: "127.0.0.1:0", Root: o.root, Log: slog.New(slog.DiscardHandler),
		Register: func(srv *rpc.Server) error {
			svc, err := storeapi.Register(srv)
			if err != nil {
				return err
			}
			return svc.Add(storeName, s)
		},
	}, func(addr string) { fmt.Println("ready", addr) })
}

func dial(ctx context.Context, o *options) (*storeapi.Client, error) {
	opts := []storeapi.DialOption{storeapi.WithRoot(o.root)}
	if o.mode == modeBytes {
		opts = append(opts, storeapi.WithBytes())
	}
	c, err := storeapi.Dial(ctx, o.addr, storeName, opts...)
	if err != nil {
		return nil, err
	}
	want := o.mode
	if want == "" {
		want = modeRef
	}
	if storeMode(c) != want {
		c.Close()
		return nil, fmt.Errorf("the client's mode is %s, not %s", storeMode(c), want)
	}
	return c, nil
}

// publishResult is a publisher's: when it called Publish for each version
// (ns since the epoch), and how long the calls took.
type publishResult struct {
	Start   map[uint64]int64 `json:"start"`
	Publish report.Latency   `json:"publish"`
}

// params returns a parameter set of mb MiB (one float32 tensor "w") and
// its data, to change between versions. The data is random, as trained
// weights are to a compressor: the rpc layer's lz4 finds nothing to gain,
// and bytes mode moves every byte, as the raw TCP baseline does.
func params(mb int) (*tensordict.TensorDict, []byte, error) {
	n := mb << 20
	data := randomBytes(n, uint64(mb))
	w, err := tensordict.FromBytes(memmap.Float32, []int{n / 4}, data)
	if err != nil {
		return nil, nil, err
	}
	td, err := tensordict.New()
	if err != nil {
		return nil, nil, err
	}
	if err := td.Set("w", w); err != nil {
		return nil, nil, err
	}
	return td, data, nil
}

// rolePublisher publishes a new version of the parameter set --param every
// --period for --duration: a fresh value each time, whose first 8 bytes
// are the version's sequence number and the next 4 the CRC-32C of the rest
// (sealVersion), so that readers check every byte without a second key.
func rolePublisher(ctx context.Context, o *options) (*publishResult, error) {
	c, err := dial(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	td, data, err := params(o.mb)
	if err != nil {
		return nil, err
	}
	fmt.Println("ready")
	res := &publishResult{Start: map[uint64]int64{}}
	tick := time.NewTicker(o.period)
	defer tick.Stop()
	end := time.Now().Add(o.duration)
	for seq := uint64(1); time.Now().Before(end); seq++ {
		sealVersion(data, seq)
		start := time.Now()
		v, err := c.Publish(ctx, o.param, td)
		if err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
		res.Publish.Record(time.Since(start))
		res.Start[v] = start.UnixNano()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return res, nil
		}
	}
	return res, nil
}

// sealVersion writes seq into data[0:8] and the CRC-32C of data[12:] and
// seq into data[8:12].
func sealVersion(data []byte, seq uint64) {
	binary.LittleEndian.PutUint64(data, seq)
	crc := crc32.Update(crc32.Checksum(data[12:], castagnoli), castagnoli, data[:8])
	binary.LittleEndian.PutUint32(data[8:], crc)
}

// sealed reports whether data is as sealVersion left it: every byte read.
func sealed(data []byte) bool {
	if len(data) < 12 {
		return false
	}
	crc := crc32.Update(crc32.Checksum(data[12:], castagnoli), castagnoli, data[:8])
	return binary.LittleEndian.Uint32(data[8:]) == crc
}

// readResult is a reader's: when it held each version, every byte read
// and its CRC checked (ns since the epoch), and how many CRCs were wrong.
type readResult struct {
	Held   map[uint64]int64 `json:"held"`
	BadCRC int              `json:"bad_crc"`
}

// roleReader waits for each newer version of --param and reads every byte
// of it, until its context ends.
func roleReader(ctx context.Context, o *options) (*readResult, error) {
	c, err := dial(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	fmt.Println("ready")
	res := &readResult{Held: map[uint64]int64{}}
	var last uint64
	// By bytes, each version is read into the first one's memory, as the
	// raw TCP baseline reads into one buffer (WaitNewerInto); by
	// reference each is a mapping and buf stays nil.
	var buf *tensordict.TensorDict
	for {
		p, err := c.WaitNewerInto(ctx, o.param, last, buf)
		if err != nil {
			if ctx.Err() != nil {
				return res, nil
			}
			return nil, err
		}
		ok, err := checkParams(p.TD)
		now := time.Now()
		p.Close()
		if err != nil {
			return nil, err
		}
		if !ok {
			res.BadCRC++
		}
		res.Held[p.Version] = now.UnixNano()
		last = p.Version
		if buf == nil && !c.SharedFS() {
			buf = p.TD // a copy in Go memory, the reader's to keep
		}
		fmt.Println("held", last)
	}
}

// checkParams reads every byte of a parameter set and checks its CRC. A
// mapping is read in place (the version is immutable and leased).
func checkParams(td *tensordict.TensorDict) (bool, error) {
	w, err := td.Tensor("w")
	if err != nil {
		return false, err
	}
	b, err := w.Bytes()
	if err != nil {
		return false, err
	}
	return sealed(b), nil
}

// number returns a NonTensor's number however it was decoded: float64
// (bytes), json.Number (a mapped prefix), or a Go integer.
func number(v any) (uint64, bool) {
	switch v := v.(type) {
	case float64:
		return uint64(v), v >= 0
	case json.Number:
		n, err := strconv.ParseUint(string(v), 10, 64)
		return n, err == nil
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int:
		return uint64(v), v >= 0
	}
	return 0, false
}

// The raw TCP baseline: a relay that receives each message whole from the
// publisher and then sends it to every reader at once, as the node stores
// a version and then serves it. A message is an 8-byte length, an 8-byte
// sequence number, then the payload.

// roleRelay accepts --n readers (each says 'R') and one publisher ('P'),
// prints "ready ADDR" first, and relays until the publisher closes.
func roleRelay(ctx context.Context, o *options) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("ready", l.Addr())
	context.AfterFunc(ctx, func() { l.Close() })
	var readers []net.Conn
	var pub net.Conn
	for pub == nil || len(readers) < o.n {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		var kind [1]byte
		if _, err := io.ReadFull(conn, kind[:]); err != nil {
			return err
		}
		if kind[0] == 'P' {
			pub = conn
		} else {
			readers = append(readers, conn)
		}
	}
	context.AfterFunc(ctx, func() { pub.Close() })
	br := bufio.NewReaderSize(pub, 1<<20)
	var buf []byte
	for {
		var hdr [16]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return nil // the publisher is done
		}
		n := int(binary.LittleEndian.Uint64(hdr[:8]))
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(br, buf); err != nil {
			return err
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(readers))
		for _, r := range readers {
			wg.Go(func() {
				if _, err := r.Write(hdr[:]); err != nil {
					errs <- err
					return
				}
				if _, err := r.Write(buf); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
	}
}

func dialRelay(ctx context.Context, addr string, kind byte) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte{kind}); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// roleTCPPublisher sends --size MiB messages through the relay every
// --period for --duration.
func roleTCPPublisher(ctx context.Context, o *options) (*publishResult, error) {
	conn, err := dialRelay(ctx, o.addr, 'P')
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_, data, err := params(o.mb)
	if err != nil {
		return nil, err
	}
	fmt.Println("ready")
	res := &publishResult{Start: map[uint64]int64{}}
	tick := time.NewTicker(o.period)
	defer tick.Stop()
	end := time.Now().Add(o.duration)
	for seq := uint64(1); time.Now().Before(end); seq++ {
		sealVersion(data, seq)
		var hdr [16]byte
		binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
		binary.LittleEndian.PutUint64(hdr[8:], seq)
		start := time.Now()
		if _, err := conn.Write(hdr[:]); err != nil {
			return nil, err
		}
		if _, err := conn.Write(data); err != nil {
			return nil, err
		}
		res.Publish.Record(time.Since(start))
		res.Start[seq] = start.UnixNano()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return res, nil
		}
	}
	return res, nil
}

// roleTCPReader reads every message from the relay and checks its CRC.
func roleTCPReader(ctx context.Context, o *options) (*readResult, error) {
	conn, err := dialRelay(ctx, o.addr, 'R')
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	context.AfterFunc(ctx, func() { conn.Close() })
	fmt.Println("ready")
	res := &readResult{Held: map[uint64]int64{}}
	br := bufio.NewReaderSize(conn, 1<<20)
	var buf []byte
	for seq := uint64(1); ; seq++ {
		var hdr [16]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return res, nil
		}
		n := int(binary.LittleEndian.Uint64(hdr[:8]))
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(br, buf); err != nil {
			return res, nil
		}
		if !sealed(buf) {
			res.BadCRC++
		}
		res.Held[seq] = time.Now().UnixNano()
		fmt.Println("held", seq)
	}
}

// appendResult is an appender's: how many appends each of its goroutines
// had acknowledged, the calls' latency, and when the first started and
// the last ended.
type appendResult struct {
	Acked   []int          `json:"acked"`
	Latency report.Latency `json:"latency"`
	FirstNS int64          `json:"first_ns"`
	LastNS  int64          `json:"last_ns"`
}

// rolloutItem returns rollout item i of goroutine g of appender w: 28 KB
// of observations in a pattern, its key and their CRC.
func rolloutItem(pattern []byte, w, g, i int) (*tensordict.TensorDict, error) {
	obs := make([]byte, rolloutBytes)
	copy(obs, pattern[i%256:])
	binary.LittleEndian.PutUint64(obs, uint64(i))
	x, err := tensordict.FromBytes(memmap.Uint8, []int{rolloutBytes}, obs)
	if err != nil {
		return nil, err
	}
	td, _ := tensordict.New()
	td.Set("obs", x)
	td.Set("key", &tensordict.NonTensor{Data: fmt.Sprintf("%d:%d:%d", w, g, i)})
	td.Set("crc", &tensordict.NonTensor{Data: crc32.Checksum(obs, castagnoli)})
	return td, nil
}

// rolloutPattern is random bytes to cut observations from: incompressible,
// so the rpc layer's lz4 does not shrink them.
func rolloutPattern() []byte { return randomBytes(rolloutBytes+256, 28) }

// randomBytes returns n pseudo-random bytes from seed.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n+8)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n]
}

// roleAppender appends rollout items to the bin from --inflight goroutines
// on one client until its context ends. --n is its number.
func roleAppender(ctx context.Context, o *options) (*appendResult, error) {
	c, err := dial(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	fmt.Println("ready")
	pattern := rolloutPattern()
	res := &appendResult{Acked: make([]int, o.inflight), FirstNS: time.Now().UnixNano()}
	lats := make([]report.Latency, o.inflight)
	var wg sync.WaitGroup
	errs := make(chan error, o.inflight)
	for g := range o.inflight {
		wg.Go(func() {
			tds := make([]*tensordict.TensorDict, o.extend)
			for i := 0; ctx.Err() == nil; i += o.extend {
				for k := range tds {
					td, err := rolloutItem(pattern, o.n, g, i+k)
					if err != nil {
						errs <- err
						return
					}
					tds[k] = td
				}
				start := time.Now()
				var err error
				if o.extend == 1 {
					_, err = c.Append(ctx, rolloutBin, tds[0])
				} else {
					_, err = c.Extend(ctx, rolloutBin, tds)
				}
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				lats[g].Record(time.Since(start))
				res.Acked[g] = i + o.extend
			}
		})
	}
	wg.Wait()
	res.LastNS = time.Now().UnixNano()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	for i := range lats {
		res.Latency.Merge(&lats[i])
	}
	return res, nil
}

// drainResult is the drainer's: for each appender goroutine ("w:g") the
// items it drained, and the drain's totals.
type drainResult struct {
	Seen    map[string]*seenItems `json:"seen"`
	Items   int                   `json:"items"`
	Dups    int                   `json:"dups"`
	BadCRC  int                   `json:"bad_crc"`
	Gets    int                   `json:"gets"`
	GetLat  report.Latency        `json:"get_latency"`
	FirstNS int64                 `json:"first_ns"`
	LastNS  int64                 `json:"last_ns"`
}

// seenItems are the indices drained of one appender goroutine: all below
// Max+1 but Missing.
type seenItems struct {
	Max     int   `json:"max"`
	Missing []int `json:"missing"`
	set     map[int]bool
}

// roleDrainer Gets the bin until its context ends, then until it is empty,
// checking every item.
func roleDrainer(ctx context.Context, o *options) (*drainResult, error) {
	c, err := dial(context.Background(), o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	fmt.Println("ready")
	res := &drainResult{Seen: map[string]*seenItems{}, FirstNS: time.Now().UnixNano()}
	get := func() (int, error) {
		start := time.Now()
		tds, err := c.Get(context.Background(), rolloutBin)
		if err != nil {
			return 0, err
		}
		res.GetLat.Record(time.Since(start))
		res.Gets++
		for _, td := range tds {
			if err := res.check(td); err != nil {
				return 0, err
			}
			td.Close()
		}
		return len(tds), nil
	}
	for ctx.Err() == nil {
		n, err := get()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	res.LastNS = time.Now().UnixNano()
	for {
		n, err := get()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
	}
	for _, s := range res.Seen {
		for i := 0; i <= s.Max; i++ {
			if !s.set[i] {
				s.Missing = append(s.Missing, i)
			}
		}
	}
	return res, nil
}

func (r *drainResult) check(td *tensordict.TensorDict) error {
	x, err := td.Tensor("obs")
	if err != nil {
		return err
	}
	b, err := x.Bytes()
	if err != nil {
		return err
	}
	// Go workers seal "crc", CRC-32C; Python ones "crc32", zlib's CRC-32
	// (numpy has no CRC-32C).
	if crc, err := td.NonTensor("crc32"); err == nil {
		if want, ok := number(crc.Data); !ok || want != uint64(crc32.ChecksumIEEE(b)) {
			r.BadCRC++
		}
	} else {
		crc, err := td.NonTensor("crc")
		if err != nil {
			return err
		}
		if want, ok := number(crc.Data); !ok || want != uint64(crc32.Checksum(b, castagnoli)) {
			r.BadCRC++
		}
	}
	key, err := td.NonTensor("key")
	if err != nil {
		return err
	}
	k, _ := key.Data.(string)
	wg, idx, ok := strings.Cut(k[strings.Index(k, ":")+1:], ":")
	if !ok {
		return fmt.Errorf("item key %q", k)
	}
	i, err := strconv.Atoi(idx)
	if err != nil {
		return err
	}
	id := k[:strings.Index(k, ":")] + ":" + wg
	s := r.Seen[id]
	if s == nil {
		s = &seenItems{Max: -1, set: map[int]bool{}}
		r.Seen[id] = s
	}
	if s.set[i] {
		r.Dups++
	}
	s.set[i] = true
	s.Max = max(s.Max, i)
	r.Items++
	return nil
}

// putResult is the putter's: when it called Put for each revision.
type putResult struct {
	Start map[uint64]int64 `json:"start"`
}

// rolePutter Puts a small TensorDict into the watched bin every --period
// for --duration.
func rolePutter(ctx context.Context, o *options) (*putResult, error) {
	c, err := dial(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	fmt.Println("ready")
	res := &putResult{Start: map[uint64]int64{}}
	td, err := tensordict.New()
	if err != nil {
		return nil, err
	}
	x, _ := tensordict.FromSlice([]float32{1, 2, 3, 4})
	td.Set("x", x)
	tick := time.NewTicker(o.period)
	defer tick.Stop()
	for end := time.Now().Add(o.duration); time.Now().Before(end); {
		start := time.Now()
		rev, err := c.Put(ctx, watchBin, td)
		if err != nil {
			return nil, err
		}
		res.Start[rev] = start.UnixNano()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return res, nil
		}
	}
	return res, nil
}

// watchResult is a watcher process's: for each of its clients, when it
// held each event (ns since the epoch), by revision.
type watchResult struct {
	Held []map[uint64]int64 `json:"held"`
}

// roleWatcher runs --n watchers, each a client of its own, watching the
// watched bin from now on until its context ends.
func roleWatcher(ctx context.Context, o *options) (*watchResult, error) {
	res := &watchResult{Held: make([]map[uint64]int64, o.n)}
	clients := make([]*storeapi.Client, o.n)
	for i := range clients {
		c, err := dial(ctx, o)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
		res.Held[i] = map[uint64]int64{}
	}
	var wg sync.WaitGroup
	started := make(chan struct{}, o.n)
	for i, c := range clients {
		wg.Go(func() {
			first := true
			for e, err := range c.Watch(ctx, watchBin, storeapi.FromNow) {
				if first {
					started <- struct{}{}
					first = false
				}
				if err != nil {
					return
				}
				res.Held[i][e.Revision] = time.Now().UnixNano()
			}
		})
	}
	// The watches are in place once their first calls are out; the parent
	// waits a moment more before it starts the putter.
	fmt.Println("ready")
	wg.Wait()
	return res, nil
}

// storeMode names c's mode as the benchmark's JSON does: "ref" or "bytes".
func storeMode(c *storeapi.Client) string {
	if c.SharedFS() {
		return "ref"
	}
	return "bytes"
}
