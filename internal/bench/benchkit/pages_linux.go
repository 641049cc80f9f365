package benchkit

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Measuring cold access to a file that several processes map takes two
// steps, because the kernel never drops a cached page that some process
// still maps: posix_fadvise(POSIX_FADV_DONTNEED), which memmap.Tensor.Evict
// uses, skips such pages. So every process that touched the pages first
// drops its own page-table entries (DropMappings), and then one of them
// evicts the file's clean pages (memmap.Tensor.Evict). Resident checks that
// it worked. All three need Linux; elsewhere (pages_other.go) they return
// errors wrapping errors.ErrUnsupported, and cold figures cannot be
// measured.

// Resident reports how many of the memory pages that b spans are resident:
// for a file mapping, in the page cache, whatever process brought them in.
// It only asks the kernel (mincore) and touches none of b.
func Resident(b []byte) (resident, pages int, err error) {
	if len(b) == 0 {
		return 0, 0, nil
	}
	ps := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	aligned := start &^ (ps - 1) // a mapping starts on a page boundary
	length := uintptr(len(b)) + start - aligned
	vec := make([]byte, (length+ps-1)/ps)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, aligned, length, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, 0, fmt.Errorf("mincore: %w", errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec), nil
}

// DropMappings drops this process's page-table entries for every mapping of
// the file that b is (a slice of) a mapping of: the mapping b belongs to and
// any other mapping of the same file (same device and inode in
// /proc/self/maps), such as one opened read-only by other code in the
// process. The next access through them faults, and the file's pages are no
// longer pinned in the page cache by this process. Data is not lost: a
// shared mapping's dirty pages stay dirty in the page cache. It returns how
// many mappings it dropped.
//
// It is a benchmark tool, for Linux only. It must not race with the
// unmapping of the file's mappings: a range unmapped and reused for other
// memory between the read of /proc/self/maps and the madvise would be
// zeroed. Private mappings of the file must not hold private writes (those
// would be discarded); read-only ones never do.
func DropMappings(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("drop mappings: empty slice")
	}
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	maps, err := readMaps()
	if err != nil {
		return 0, err
	}
	var file *mapsEntry
	for i := range maps {
		if m := &maps[i]; m.start <= addr && addr < m.end {
			file = m
		}
	}
	if file == nil || file.inode == "0" {
		return 0, fmt.Errorf("drop mappings: address %#x is not in a file mapping", addr)
	}
	n := 0
	for _, m := range maps {
		if m.dev != file.dev || m.inode != file.inode {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); errno != 0 {
			return n, fmt.Errorf("drop mappings: madvise %#x-%#x: %w", m.start, m.end, errno)
		}
		n++
	}
	return n, nil
}

// mapsEntry is one line of /proc/self/maps.
type mapsEntry struct {
	start, end uint64
	dev, inode string
}

func readMaps() ([]mapsEntry, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, fmt.Errorf("drop mappings: %w", err)
	}
	defer f.Close()
	var out []mapsEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, mapsEntry{start: start, end: end, dev: fs[3], inode: fs[4]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("drop mappings: %w", err)
	}
	return out, nil
}
