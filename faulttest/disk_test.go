//go:build linux

package faulttest

// A full disk: a small tmpfs as the root. Creating storage that does not fit
// is a clear error at creation that leaves nothing behind, storage that was
// created keeps working when the disk fills, and no process dies of SIGBUS,
// not even on files whose blocks were never reserved.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

const (
	diskMiB  = 1 << 20
	diskSize = 4 * diskMiB // every scenario's tmpfs
)

func diskField(dt memmap.DType, shape []int, key ...string) tensordict.Field {
	return tensordict.Field{Key: key, DType: dt, Shape: shape}
}

// rowField is diskField for a replay buffer's schema: shape is one
// transition's.
func rowField(dt memmap.DType, shape []int, key ...string) tensordict.RowField {
	return tensordict.RowField{Key: key, DType: dt, Shape: shape}
}

// diskCheckNothingLeft checks that a failed creation left dir, empty
// before it, as it found it: empty, with freeBefore bytes free.
func diskCheckNothingLeft(t *testing.T, dir string, freeBefore int64) {
	t.Helper()
	if left := diskEntries(t, dir); len(left) > 0 {
		t.Errorf("the failed creation left behind %q", left)
	}
	if free := diskFree(t, dir); free != freeBefore {
		t.Errorf("%d bytes free after the failed creation, %d before: %d bytes not given back",
			free, freeBefore, freeBefore-free)
	}
}

// TestFullDisk_TensorDictCreateTooBig: a TensorDict that does not fit the
// disk (its tensors, or its meta.json after them) is ENOSPC from Create,
// nothing is left on the disk, and all its space is free again.
func TestFullDisk_TensorDictCreateTooBig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		batch  []int
		fields []tensordict.Field
	}{
		{"one tensor larger than the disk", []int{8},
			[]tensordict.Field{diskField(memmap.Uint8, []int{8, diskMiB}, "x")}},
		{"the last of several tensors does not fit", []int{4}, []tensordict.Field{
			diskField(memmap.Uint8, []int{4, 256 << 10}, "a"),               // 1 MiB
			diskField(memmap.Float32, []int{4, 64 << 10}, "next", "reward"), // 1 MiB, in a nested folder
			diskField(memmap.Uint8, []int{4, diskMiB}, "c"),                 // 4 MiB: no room left
		}},
		{"the tensors fill the disk, leaving no room for meta.json", []int{4},
			[]tensordict.Field{diskField(memmap.Uint8, []int{4, diskMiB}, "x")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := mountTmpfs(t, diskSize)
			prefix := filepath.Join(disk, "td")
			free := diskFree(t, disk)
			td, err := tensordict.Create(prefix, tc.batch, tc.fields...)
			if err == nil {
				td.Close()
				t.Fatal("Create of a TensorDict larger than the disk succeeded")
			}
			t.Logf("Create: %v", err)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("Create: %v; want an error wrapping ENOSPC", err)
			}
			if !strings.Contains(err.Error(), prefix) {
				t.Errorf("Create: %q does not name the prefix %s", err, prefix)
			}
			diskCheckNothingLeft(t, disk, free)
		})
	}
}

// TestFullDisk_ReplayCreateTooBig: a replay buffer whose slot table,
// storage or replay.json does not fit is ENOSPC from replay.Create, Open
// finds no buffer there, and no part of one (slots.memmap, storage/) is
// left behind holding the space.
func TestFullDisk_ReplayCreateTooBig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  replay.Config
	}{
		{"slot table larger than the disk", replay.Config{Capacity: 1 << 18}}, // 32 bytes a slot: 8 MiB
		{"storage larger than the disk", replay.Config{Capacity: 1024, // slots: 32 KiB; storage: 8 MiB
			Schema: tensordict.RowSchema{rowField(memmap.Uint8, []int{8192}, "obs"), rowField(memmap.Float32, nil, "reward")}}},
		// A page of replay.lock, 32 KiB of slots, 4056 KiB of obs and a
		// page of storage/meta.json fill the disk: replay.json, written
		// last, does not fit.
		{"replay.json does not fit", replay.Config{Capacity: 1024,
			Schema: tensordict.RowSchema{rowField(memmap.Uint8, []int{4056}, "obs")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := mountTmpfs(t, diskSize)
			prefix := filepath.Join(disk, "buf")
			free := diskFree(t, disk)
			b, err := replay.Create(prefix, tc.cfg)
			if err == nil {
				b.Close()
				t.Fatal("Create of a buffer larger than the disk succeeded")
			}
			t.Logf("Create: %v", err)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("Create: %v; want an error wrapping ENOSPC", err)
			}
			if !strings.Contains(err.Error(), prefix) {
				t.Errorf("Create: %q does not name the prefix %s", err, prefix)
			}
			if _, err := replay.Open(prefix); !errors.Is(err, replay.ErrNotFound) {
				t.Errorf("Open after the failed Create: %v; want ErrNotFound", err)
			}
			diskCheckNothingLeft(t, disk, free)
		})
	}
}

// TestFullDisk_ReplayStorageAtFirstExtend: a buffer created without a
// schema creates its storage at the first Extend; storage that does not fit
// is ENOSPC from that Extend, which adds nothing and leaves no storage
// behind, and the buffer stays as it was.
func TestFullDisk_ReplayStorageAtFirstExtend(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	prefix := filepath.Join(disk, "buf")
	b, err := replay.Create(prefix, replay.Config{Capacity: 1024, Sampler: replay.WithoutReplacement()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	free := diskFree(t, disk)
	before := diskEntries(t, disk)
	ctx := context.Background()
	_, err = b.Extend(ctx, diskBatch(t, 8192, 0, 1))
	if err == nil {
		t.Fatal("an Extend whose storage (8 MiB) does not fit a 4 MiB disk succeeded")
	}
	t.Logf("Extend: %v", err)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Extend: %v; want an error wrapping ENOSPC", err)
	}
	if n := b.Len(); n != 0 {
		t.Errorf("Len = %d after the failed Extend, want 0", n)
	}
	if s := b.Schema(); s != nil {
		t.Errorf("Schema = %v after the failed Extend, want none yet", s)
	}
	if got := diskEntries(t, disk); !slices.Equal(got, before) {
		t.Errorf("the failed Extend left %q; before it the disk held %q", got, before)
	}
	if got := diskFree(t, disk); got != free {
		t.Errorf("%d bytes free after the failed Extend, %d before", got, free)
	}
	// A batch that fits sets the schema and is sampled back.
	if _, err := b.Extend(ctx, diskBatch(t, 64, 5, 6)); err != nil {
		t.Fatalf("an Extend that fits, after the failed one: %v", err)
	}
	if got := diskSampleAll(t, b); !slices.Equal(got, []int{5, 6}) {
		t.Errorf("sampled ids %v, want [5 6]", got)
	}
}

// diskBatch returns transitions with the given ids: obs uint8 [obsLen]
// filled with the id (mod 256), and id int64.
func diskBatch(t testing.TB, obsLen int, ids ...int) *tensordict.TensorDict {
	t.Helper()
	td, err := diskMakeBatch(obsLen, ids...)
	if err != nil {
		t.Fatal(err)
	}
	return td
}

func diskMakeBatch(obsLen int, ids ...int) (*tensordict.TensorDict, error) {
	n := len(ids)
	obs := make([]uint8, n*obsLen)
	id := make([]int64, n)
	for i, v := range ids {
		for j := range obsLen {
			obs[i*obsLen+j] = uint8(v)
		}
		id[i] = int64(v)
	}
	td, err := tensordict.New(n)
	if err != nil {
		return nil, err
	}
	o, err := tensordict.FromSlice(obs, n, obsLen)
	if err != nil {
		return nil, err
	}
	x, err := tensordict.FromSlice(id, n)
	if err != nil {
		return nil, err
	}
	if err := td.Set("obs", o); err != nil {
		return nil, err
	}
	return td, td.Set("id", x)
}

// diskIDs returns the id of each row of a batch, failing the test if a
// row's obs does not agree with its id in every byte (a torn row).
func diskIDs(t testing.TB, td *tensordict.TensorDict) []int {
	t.Helper()
	ids, err := diskRowIDs(td)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func diskRowIDs(td *tensordict.TensorDict) ([]int, error) {
	o, err := td.Tensor("obs")
	if err != nil {
		return nil, err
	}
	x, err := td.Tensor("id")
	if err != nil {
		return nil, err
	}
	obs, err := tensordict.Values[uint8](o)
	if err != nil {
		return nil, err
	}
	id, err := tensordict.Values[int64](x)
	if err != nil {
		return nil, err
	}
	per := len(obs) / max(len(id), 1)
	out := make([]int, len(id))
	for i, v := range id {
		if row := obs[i*per : (i+1)*per]; bytes.Count(row, []byte{uint8(v)}) != per {
			return nil, fmt.Errorf("row %d (id %d) is torn: obs starts %v", i, v, row[:min(16, len(row))])
		}
		out[i] = int(v)
	}
	return out, nil
}

// diskSampleAll samples every transition of a WithoutReplacement buffer
// once and returns their ids, sorted.
func diskSampleAll(t testing.TB, b *replay.Buffer) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, _, err := b.Sample(ctx, b.Len())
	if err != nil {
		t.Fatalf("Sample of %d: %v", b.Len(), err)
	}
	got := diskIDs(t, td)
	slices.Sort(got)
	return got
}

// TestFullDisk_ReplayBufferKeepsWorking: once a buffer exists its blocks
// are reserved, so filling the disk to the last byte does not stop Extend
// or Sample (TestFullDisk_NodeServesSparseBuffer is the counterpart: the
// same writes into a storage without reserved blocks fail). Checkpoint
// cannot write replay.json then: it returns ENOSPC and the previous
// replay.json stays, whole; once space is freed it succeeds, and Open
// finds every committed transition.
func TestFullDisk_ReplayBufferKeepsWorking(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	prefix := filepath.Join(disk, "buf")
	const capacity, obsLen = 64, 4096 // storage: 256 KiB of obs, 512 B of ids
	b, err := replay.Create(prefix, replay.Config{
		Capacity: capacity,
		Schema:   tensordict.RowSchema{rowField(memmap.Uint8, []int{obsLen}, "obs"), rowField(memmap.Int64, nil, "id")},
		Sampler:  replay.WithoutReplacement(),
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			b.Close()
		}
	}()
	// The reason writes cannot meet a full disk: every block is reserved.
	for _, name := range []string{"slots.memmap", "storage/obs.memmap", "storage/id.memmap"} {
		if blocks, size := diskAllocated(t, filepath.Join(prefix, name)); blocks < size {
			t.Errorf("%s: %d bytes allocated for %d: its blocks are not reserved", name, blocks, size)
		}
	}
	ctx := context.Background()
	next := 0
	extend := func(n int) {
		t.Helper()
		idsIn := make([]int, n)
		for i := range idsIn {
			idsIn[i] = next
			next++
		}
		if _, err := b.Extend(ctx, diskBatch(t, obsLen, idsIn...)); err != nil {
			t.Fatalf("Extend of ids %d..%d: %v", idsIn[0], idsIn[n-1], err)
		}
	}
	extend(10)
	if err := b.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	metaPath := filepath.Join(prefix, replay.MetaFile)
	meta, err := os.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}

	filler := fillDisk(t, disk)
	// Twice round the ring: every slot and every page of the storage is
	// written with the disk full.
	for range 2 * capacity / 16 {
		extend(16)
	}
	want := make([]int, 0, capacity)
	for id := next - capacity; id < next; id++ {
		want = append(want, id)
	}
	if got := diskSampleAll(t, b); !slices.Equal(got, want) {
		t.Errorf("sampled ids %v, want the last %d extended: %v", got, capacity, want)
	}
	if free := diskFree(t, disk); free != 0 {
		t.Errorf("%d bytes free after the writes: they allocated or freed blocks", free)
	}

	err = b.Checkpoint(ctx)
	t.Logf("Checkpoint on the full disk: %v", err)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Checkpoint on the full disk: %v; want an error wrapping ENOSPC", err)
	}
	if got, err := os.ReadFile(metaPath); err != nil || !bytes.Equal(got, meta) {
		t.Errorf("%s after the failed Checkpoint: %v; it changed from\n%s\nto\n%s", replay.MetaFile, err, meta, got)
	}
	if got := diskEntries(t, prefix); !slices.Equal(got, []string{"replay.json", "replay.lock", "slots.memmap", "storage/", "storage/id.memmap", "storage/meta.json", "storage/obs.memmap"}) {
		t.Errorf("the buffer's folder holds %q after the failed Checkpoint", got)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := b.Checkpoint(ctx); err != nil {
		t.Fatalf("Checkpoint once space is free: %v", err)
	}
	if got, _ := os.ReadFile(metaPath); bytes.Equal(got, meta) {
		t.Errorf("%s is unchanged by the Checkpoint that succeeded", replay.MetaFile)
	}
	closed = true
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b, err = replay.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if st, _ := b.Stats(); st.Inserted != int64(next) {
		t.Errorf("reopened: Inserted = %d, want %d (the checkpoint's count)", st.Inserted, next)
	}
	if got := diskSampleAll(t, b); !slices.Equal(got, want) {
		t.Errorf("reopened: sampled ids %v, want %v", got, want)
	}
}

// diskRunCLI runs the tensorwire command to its end (20 s at most) and
// returns its stdout, stderr and how it exited.
func diskRunCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, program(t, "./cmd/tensorwire"), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tensorwire %s did not exit within 20 s; stderr:\n%s", strings.Join(args, " "), e.String())
	}
	return o.String(), e.String(), err
}

// diskCheckFailedCleanly checks that a command failed with exit status 1,
// not of a fault, and with a message on stderr mentioning each of want.
func diskCheckFailedCleanly(t *testing.T, err error, stderr string, want ...string) {
	t.Helper()
	if death := diskDeath(err, stderr); death != "" {
		t.Fatalf("%s", death)
	}
	t.Logf("%v; stderr:\n%s", err, stderr)
	if code, _, _ := diskExitStatus(err); err == nil || code != 1 {
		t.Errorf("exit status %d (%v), want 1; stderr:\n%s", code, err, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, stderr)
		}
	}
}

// TestFullDisk_NodeBufferTooBig: "tensorwire node --buffer" creating a
// buffer that does not fit exits with status 1 and says why, and leaves no
// part of the buffer behind.
func TestFullDisk_NodeBufferTooBig(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	free := diskFree(t, disk)
	stdout, stderr, err := diskRunCLI(t, "node", "--listen", "127.0.0.1:0", "--root", disk,
		"--buffer", "big,capacity=1000000") // a 32 MB slot table
	diskCheckFailedCleanly(t, err, stderr, "no space left on device", filepath.Join(disk, "big"))
	if strings.Contains(stdout, nodeproc.ListeningPrefix) {
		t.Errorf("the node listened: %q", stdout)
	}
	if strings.Contains(stderr, "buffer created") {
		t.Error(`the node logged "buffer created" for a buffer it failed to create`)
	}
	diskCheckNothingLeft(t, disk, free)
}

// diskWriteNPY writes a .npy file of uint8 [shape...] outside the tmpfs.
func diskWriteNPY(t *testing.T, dir, name string, shape ...int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := npy.Header{DType: memmap.Uint8, Shape: shape}
	if err := npy.WriteHeader(f, h); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte{7}, int(h.NumBytes()))); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFullDisk_ImportTooBig: "tensorwire import" of a dataset larger than
// the disk fails with status 1 and ENOSPC's message, and leaves neither the
// prefix nor its temporary folder.
func TestFullDisk_ImportTooBig(t *testing.T) {
	skipShort(t)
	src := t.TempDir()                                         // the input, not on the small disk
	big := diskWriteNPY(t, src, "big.npy", 4, 2*diskMiB)       // 8 MiB
	small := diskWriteNPY(t, src, "small.npy", 4, 256<<10)     // 1 MiB
	three := diskWriteNPY(t, src, "three.npy", 4, 3*diskMiB/4) // 3 MiB
	four := diskWriteNPY(t, src, "four.npy", 4, diskMiB)       // 4 MiB
	for _, tc := range []struct {
		name  string
		files []string
	}{
		{"one array larger than the disk", []string{"x=" + big}},
		{"the second array does not fit", []string{"a=" + small, "b/c=" + four}},
		{"the arrays fill the disk, leaving no room for meta.json", []string{"a=" + small, "b/c=" + three}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := mountTmpfs(t, diskSize)
			free := diskFree(t, disk)
			prefix := filepath.Join(disk, "out")
			_, stderr, err := diskRunCLI(t, append(append([]string{"import", "npy"}, tc.files...), prefix)...)
			diskCheckFailedCleanly(t, err, stderr, "no space left on device", prefix)
			diskCheckNothingLeft(t, disk, free)
		})
	}
}

// The SIGBUS case: files whose blocks were never reserved (sparse, as
// tensordict in Python or "cp --sparse" leave them) on a full tmpfs. Every
// first touch of a page of such a file needs a block, and the kernel
// answers a fault it cannot back with SIGBUS: a write anywhere, and on
// tmpfs a read too. Copies through memmap's guarded paths must turn that
// into memmap.ErrFault, and the process must live on.

// diskSparseTD creates a TensorDict at prefix with a uint8 [rows, rowLen]
// tensor "x", then replaces its file by a sparse one of the same size.
func diskSparseTD(t *testing.T, prefix string, rows, rowLen int) {
	t.Helper()
	td, err := tensordict.Create(prefix, []int{rows}, diskField(memmap.Uint8, []int{rows, rowLen}, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Close(); err != nil {
		t.Fatal(err)
	}
	if blocks := makeSparse(t, filepath.Join(prefix, "x.memmap")); blocks != 0 {
		t.Fatalf("the sparse copy of x.memmap holds %d bytes of blocks, want none", blocks)
	}
}

// diskReport prints one line of a helper's result, as diskRunHelper reads
// it: "STEP<TAB>ok|nospace|fault|dataloss|error<TAB>detail".
func diskReport(step string, err error) {
	status := "ok"
	switch {
	case errors.Is(err, syscall.ENOSPC):
		status = "nospace"
	case errors.Is(err, memmap.ErrFault):
		status = "fault"
	case errors.Is(err, rpc.ErrDataLoss):
		status = "dataloss"
	case err != nil:
		status = "error"
	}
	fmt.Printf("%s\t%s\t%v\n", step, status, err)
}

// diskRunHelper runs this test binary as the helper role with args, waits
// for it (20 s at most), fails the test if it died of a fault or did not
// exit 0, and returns its report: status and detail by step.
func diskRunHelper(t *testing.T, role string, args ...string) map[string][2]string {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	p := proctest.StartCmd(t, "helper "+role, cmd)
	err := p.WaitFor(time.Minute)
	t.Logf("helper %s:\n%s", role, p.Output())
	if death := diskDeath(err, p.Stderr()); death != "" {
		t.Fatalf("helper %s %s", role, death)
	} else if err != nil {
		t.Fatalf("helper %s: %v; stderr:\n%s", role, err, p.Stderr())
	}
	got := map[string][2]string{}
	for _, line := range strings.Split(strings.TrimSpace(p.Output()), "\n") {
		step, rest, _ := strings.Cut(line, "\t")
		status, detail, _ := strings.Cut(rest, "\t")
		got[step] = [2]string{status, detail}
	}
	return got
}

// diskWantSteps checks a helper's report: each step with its status.
func diskWantSteps(t *testing.T, got map[string][2]string, want ...[2]string) {
	t.Helper()
	for _, w := range want {
		if g := got[w[0]]; g[0] != w[1] {
			t.Errorf("%s: %q (%s), want %s", w[0], g[0], g[1], w[1])
		}
	}
}

func init() {
	// roles["disk-sparse-writes"] PREFIX FILLER: loads the TensorDict at
	// PREFIX (a sparse x, uint8 [rows, rowLen], on a full disk) and writes
	// and reads it, then removes FILLER and does it again. It prints one
	// line per step: "STEP<TAB>ok|fault|error<TAB>detail".
	roles["disk-sparse-writes"] = func(ctx context.Context, args []string) error {
		if len(args) != 2 {
			return fmt.Errorf("want PREFIX FILLER, got %q", args)
		}
		prefix, filler := args[0], args[1]
		report := diskReport
		td, err := tensordict.LoadMemmap(prefix)
		report("load", err)
		if err != nil {
			return nil
		}
		defer td.Close()
		x, err := td.Tensor("x")
		if err != nil {
			return err
		}
		n, rowLen := x.Len(), x.RowBytes()
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		src := diskBatchOf(rowLen, 2, 9)
		report("fill", td.Fill(all, 1))
		report("setrows", td.SetRows([]int{n - 2, n - 1}, src))
		_, err = td.Gather([]int{n / 2})
		report("gather", err)
		report("free", os.Remove(filler))
		report("fill-after-free", td.Fill(all, 1))
		report("setrows-after-free", td.SetRows([]int{n - 2, n - 1}, src))
		got, err := td.Gather([]int{0, n - 1})
		if err == nil {
			err = diskWantRows(got, rowLen, 1, 9)
		}
		report("gather-after-free", err)
		return nil
	}
}

// diskBatchOf returns a TensorDict of n rows of an x uint8 [rowLen], every
// byte v.
func diskBatchOf(rowLen, n int, v byte) *tensordict.TensorDict {
	x, err := tensordict.FromSlice(bytes.Repeat([]byte{v}, n*rowLen), n, rowLen)
	if err != nil {
		panic(err)
	}
	td, err := tensordict.New(n)
	if err != nil {
		panic(err)
	}
	if err := td.Set("x", x); err != nil {
		panic(err)
	}
	return td
}

// diskWantRows checks that row i of td's x holds only vals[i].
func diskWantRows(td *tensordict.TensorDict, rowLen int, vals ...byte) error {
	x, err := td.Tensor("x")
	if err != nil {
		return err
	}
	b, err := tensordict.Values[uint8](x)
	if err != nil {
		return err
	}
	for i, v := range vals {
		if row := b[i*rowLen : (i+1)*rowLen]; bytes.Count(row, []byte{v}) != rowLen {
			return fmt.Errorf("row %d does not hold only %d: starts %v", i, v, row[:min(16, len(row))])
		}
	}
	return nil
}

// TestFullDisk_SparseFileWritesAreErrors: writes through tensordict into
// holes of a sparse file on a full tmpfs are ENOSPC (memmap reserves the
// blocks before it writes), reads of a hole are memmap.ErrFault, in a
// process that lives on; once space is freed the same TensorDict works.
// The library calls run in a helper process, so that a SIGBUS kills only
// the helper and fails this test instead of the whole suite.
func TestFullDisk_SparseFileWritesAreErrors(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	prefix := filepath.Join(disk, "td")
	diskSparseTD(t, prefix, 64, 16<<10) // 1 MiB, no block allocated
	filler := fillDisk(t, disk)

	diskWantSteps(t, diskRunHelper(t, "disk-sparse-writes", prefix, filler),
		[2]string{"load", "ok"},               // a sparse file is a valid file
		[2]string{"fill", "nospace"},          // a write into a hole: refused before any byte moves
		[2]string{"setrows", "nospace"},       // same, through a row copy
		[2]string{"gather", "fault"},          // on tmpfs, reading a hole needs a page too
		[2]string{"free", "ok"},               // the helper removes the filler
		[2]string{"fill-after-free", "ok"},    // the same mapping works once there is room
		[2]string{"setrows-after-free", "ok"}, //
		[2]string{"gather-after-free", "ok"},  // and holds what was written
	)
}

// diskNode is "tensorwire node" running as a process, and the address it
// listens on ("" if it exited before listening).
type diskNode struct {
	*proctest.Proc
	addr string
}

// startDiskNode runs "tensorwire node --listen 127.0.0.1:0 ARGS..." and
// waits until it listens or exits.
func startDiskNode(t *testing.T, args ...string) *diskNode {
	t.Helper()
	p := proctest.StartCmd(t, "node", exec.Command(program(t, "./cmd/tensorwire"), append([]string{"node", "--listen", "127.0.0.1:0"}, args...)...))
	addr, err := p.Line(nodeproc.ListeningPrefix, 30*time.Second)
	if err != nil && p.Alive() {
		t.Fatalf("the node neither listened nor exited within 30 s; stderr:\n%s", p.Stderr())
	}
	return &diskNode{p, addr}
}

// checkAlive fails the test if the node has exited.
func (n *diskNode) checkAlive(t *testing.T) {
	t.Helper()
	if n.Alive() {
		return
	}
	if death := diskDeath(n.ExitErr(), n.Stderr()); death != "" {
		t.Fatalf("the node %s", death)
	}
	t.Fatalf("the node exited (%v); stderr:\n%s", n.ExitErr(), n.Stderr())
}

// stopClean sends SIGTERM and checks that the node exits with status 0.
func (n *diskNode) stopClean(t *testing.T) {
	t.Helper()
	err := n.Stop(30 * time.Second)
	if death := diskDeath(err, n.Stderr()); death != "" {
		t.Errorf("the node %s", death)
	} else if err != nil {
		t.Errorf("the node: %v after SIGTERM, want status 0; stderr:\n%s", err, n.Stderr())
	}
}

// diskToken writes a random token to a new file outside the disk, and
// returns its path and the token.
func diskToken(t *testing.T) (string, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := nodeproc.WriteRandomToken(p); err != nil {
		t.Fatal(err)
	}
	tok, err := nodeproc.ReadToken(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, tok
}

// TestFullDisk_NodeSurvivesSparseFill: a real node asked to fill, by
// reference, a sparse TensorDict on a full tmpfs answers ResourceExhausted
// (the write's ENOSPC), a read of one of its holes DataLoss, and it keeps
// serving: a describe and a fill of a good TensorDict succeed afterwards,
// the sparse one can be filled once space is freed, and the node stops
// cleanly.
func TestFullDisk_NodeSurvivesSparseFill(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	tokPath, tok := diskToken(t)
	n := startDiskNode(t, "--root", disk, "--token-file", tokPath)
	if n.addr == "" {
		t.Fatalf("the node exited before listening: %v; stderr:\n%s", n.ExitErr(), n.Stderr())
	}
	good, err := tensordict.Create(filepath.Join(disk, "good"), []int{16}, diskField(memmap.Uint8, []int{16, 4096}, "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	const rows, rowLen = 64, 16 << 10
	diskSparseTD(t, filepath.Join(disk, "sparse"), rows, rowLen)
	sparse, err := tensordict.LoadMemmap(filepath.Join(disk, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer sparse.Close()
	filler := fillDisk(t, disk)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, n.addr, rpc.WithRoot(disk), rpc.WithToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if shared, err := c.SharedFS(ctx); !shared || err != nil {
		t.Fatalf("SharedFS = %v, %v; want true: the fill must go by reference", shared, err)
	}

	err = c.Fill(ctx, sparse, nil, 1)
	t.Logf("Fill of the sparse TensorDict: %v", err)
	if !errors.Is(err, rpc.ErrResourceExhausted) {
		t.Errorf("Fill of a sparse file on a full disk: %v; want ResourceExhausted", err)
	}
	n.checkAlive(t)
	_, err = c.Read(ctx, "sparse", []int{rows / 2})
	t.Logf("Read of the sparse TensorDict: %v", err)
	if !errors.Is(err, rpc.ErrDataLoss) {
		t.Errorf("Read of a hole of a sparse file on a full tmpfs: %v; want DataLoss", err)
	}
	n.checkAlive(t)

	if d, err := c.Describe(ctx, "good"); err != nil || d.Bytes != 16*4096 {
		t.Errorf("Describe after the faults: %+v, %v", d, err)
	}
	if err := c.Fill(ctx, good, []int{3}, 5); err != nil {
		t.Errorf("Fill of a good TensorDict after the faults: %v", err)
	}
	if got, err := good.Gather([]int{3}); err != nil {
		t.Error(err)
	} else if err := diskWantRows(got, 4096, 5); err != nil {
		t.Errorf("the good fill: %v", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := c.Fill(ctx, sparse, []int{0, rows - 1}, 9); err != nil {
		t.Errorf("Fill of the sparse TensorDict once space is free: %v", err)
	}
	if got, err := sparse.Gather([]int{0, rows - 1}); err != nil {
		t.Error(err)
	} else if err := diskWantRows(got, rowLen, 9, 9); err != nil {
		t.Errorf("the fill once space is free: %v", err)
	}
	n.checkAlive(t)
	n.stopClean(t)
}

// diskSparseBuffer makes a replay buffer at prefix holding transitions 1,
// 2 and 3, then makes its files sparse, as copying it with "cp --sparse"
// or "rsync -S" would: its slot table is two pages, the second all zeros;
// its storage rows are a page each, only the first three written.
func diskSparseBuffer(t *testing.T, prefix string) {
	t.Helper()
	b, err := replay.Create(prefix, replay.Config{
		Capacity: 256,
		Schema:   tensordict.RowSchema{rowField(memmap.Uint8, []int{4096}, "obs"), rowField(memmap.Int64, nil, "id")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Extend(context.Background(), diskBatch(t, 4096, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"slots.memmap", "storage/obs.memmap", "storage/id.memmap"} {
		makeSparse(t, filepath.Join(prefix, name))
	}
	for _, name := range []string{"slots.memmap", "storage/obs.memmap"} {
		if blocks, size := diskAllocated(t, filepath.Join(prefix, name)); blocks >= size {
			t.Fatalf("the sparse copy of %s holds %d bytes of blocks for %d", name, blocks, size)
		}
	}
}

// TestFullDisk_NodeOpensSparseBuffer: "tensorwire node --buffer" started on
// a full tmpfs with a buffer whose files are sparse. Opening the buffer
// reads its whole slot table, which on a full tmpfs faults on every hole:
// the node must refuse the buffer (exit status 1 and a message), or serve
// it and answer an Extend, which writes slot words, with a result or an
// error; it must not die of SIGBUS.
func TestFullDisk_NodeOpensSparseBuffer(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	diskSparseBuffer(t, filepath.Join(disk, "buf"))
	filler := fillDisk(t, disk)
	tokPath, tok := diskToken(t)
	n := startDiskNode(t, "--root", disk, "--token-file", tokPath, "--buffer", "buf")
	if n.addr == "" {
		diskCheckFailedCleanly(t, n.ExitErr(), n.Stderr(), "no space left on device")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := replay.Dial(ctx, n.addr, "buf", replay.WithBytes(), replay.WithRPC(rpc.WithToken(tok)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Extend(ctx, diskBatch(t, 4096, 4, 5))
	t.Logf("Extend on the full disk: %v", err)
	n.checkAlive(t)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n.stopClean(t)
}

func init() {
	// roles["disk-ref-client"] ADDR TOKENFILE ROOT ID: a replay client of
	// buffer "buf" by reference, writing and reading the storage in this
	// process. It extends transitions ID and ID+1 and samples 8, and
	// reports both (diskReport); a sample's detail is the ids it returned.
	roles["disk-ref-client"] = func(ctx context.Context, args []string) error {
		if len(args) != 4 {
			return fmt.Errorf("want ADDR TOKENFILE ROOT ID, got %q", args)
		}
		tok, err := nodeproc.ReadToken(args[1])
		if err != nil {
			return err
		}
		var id int
		if _, err := fmt.Sscan(args[3], &id); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		c, err := replay.Dial(ctx, args[0], "buf", replay.WithRoot(args[2]), replay.WithRPC(rpc.WithToken(tok)))
		if err != nil {
			return err
		}
		defer c.Close()
		if !c.SharedFS() {
			return fmt.Errorf("the client works by bytes, want by reference")
		}
		td, err := diskMakeBatch(4096, id, id+1)
		if err != nil {
			return err
		}
		_, err = c.Extend(ctx, td)
		diskReport("extend", err)
		got, _, err := c.Sample(ctx, 8)
		if err == nil {
			var ids []int
			if ids, err = diskRowIDs(got); err == nil {
				fmt.Printf("sample\tok\t%v\n", ids)
				return nil
			}
		}
		diskReport("sample", err)
		return nil
	}
}

// TestFullDisk_NodeServesSparseBuffer: a node serving a buffer whose files
// are sparse, when the disk fills under it. Extends whose rows land on
// holes of the storage fail: by bytes the node writes them and answers
// ResourceExhausted, by reference the client writes them and gets ENOSPC
// (in a helper process, so that a SIGBUS there would not kill the suite).
// No process dies, the committed transitions are still sampled, and once
// space is freed Extend works again.
func TestFullDisk_NodeServesSparseBuffer(t *testing.T) {
	disk := mountTmpfs(t, diskSize)
	diskSparseBuffer(t, filepath.Join(disk, "buf"))
	tokPath, tok := diskToken(t)
	n := startDiskNode(t, "--root", disk, "--token-file", tokPath, "--buffer", "buf")
	if n.addr == "" {
		t.Fatalf("the node exited before listening with room on the disk: %v; stderr:\n%s", n.ExitErr(), n.Stderr())
	}
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 30*time.Second)
	}
	ctx, cancel := call()
	c, err := replay.Dial(ctx, n.addr, "buf", replay.WithBytes(), replay.WithRPC(rpc.WithToken(tok)))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	filler := fillDisk(t, disk)

	ctx, cancel = call()
	_, err = c.Extend(ctx, diskBatch(t, 4096, 4, 5))
	cancel()
	t.Logf("Extend (bytes mode) into holes of the storage on the full disk: %v", err)
	if !errors.Is(err, rpc.ErrResourceExhausted) {
		t.Errorf("Extend (bytes mode) into holes of a sparse storage on a full disk: %v; want ResourceExhausted", err)
	}
	n.checkAlive(t)
	ctx, cancel = call()
	td, _, err := c.Sample(ctx, 8)
	cancel()
	if err != nil {
		t.Errorf("Sample (bytes mode) after the failed Extend: %v", err)
	} else {
		for _, id := range diskIDs(t, td) {
			if id < 1 || id > 3 {
				t.Errorf("Sample (bytes mode) returned transition %d; only 1, 2 and 3 were committed", id)
			}
		}
	}
	got := diskRunHelper(t, "disk-ref-client", n.addr, tokPath, disk, "6")
	diskWantSteps(t, got, [2]string{"extend", "nospace"}, [2]string{"sample", "ok"})
	if ids := strings.Fields(strings.Trim(got["sample"][1], "[]")); slices.ContainsFunc(ids, func(id string) bool { return id != "1" && id != "2" && id != "3" }) {
		t.Errorf("Sample (ref mode) returned transitions %v; only 1, 2 and 3 were committed", ids)
	}
	n.checkAlive(t)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = call()
	_, err = c.Extend(ctx, diskBatch(t, 4096, 8, 9))
	cancel()
	if err != nil {
		t.Errorf("Extend (bytes mode) once space is free: %v", err)
	}
	diskWantSteps(t, diskRunHelper(t, "disk-ref-client", n.addr, tokPath, disk, "10"),
		[2]string{"extend", "ok"}, [2]string{"sample", "ok"})
	n.checkAlive(t)
	n.stopClean(t)
}
