package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
)

// The lane's frames (lane.go), on every platform; lane_test.go runs lanes.

// TestLane_Frames: the frames' bytes are docs/protocol.md's ("serve.replica
// lanes"), and an answer frame reads back.
func TestLane_Frames(t *testing.T) {
	batch := make([]byte, laneBatchSize)
	putLaneBatch(batch, 7, 16, 2)
	answer := appendLaneAnswer(nil, replicaAnswer{Batch: 7, Version: 3})
	failed := appendLaneAnswer(nil, replicaAnswer{Batch: 7, Version: 3, Error: "ValueError: boom"})
	want := map[string][]byte{"batch": batch, "answer": answer, "answer, error": failed}
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(doc), "<!-- begin serve lane frames -->\n")
	block, _, ok := strings.Cut(block, "<!-- end serve lane frames -->")
	if !ok {
		t.Fatal("docs/protocol.md has no serve lane frames block")
	}
	seen := 0
	for _, line := range strings.Split(block, "\n") {
		name, hexs, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		name = strings.TrimPrefix(name, "# ")
		got, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(hexs), " ", ""))
		if err != nil {
			t.Fatalf("docs/protocol.md, %s: %v", name, err)
		}
		if w, ok := want[name]; !ok || !bytes.Equal(got, w) {
			t.Errorf("docs/protocol.md shows the lane's %q as\n%x\nwant\n%x", name, got, w)
		}
		seen++
	}
	if seen != len(want) {
		t.Errorf("docs/protocol.md shows %d lane frames; want %d", seen, len(want))
	}
	l := &lane{r: bufio.NewReader(bytes.NewReader(append(answer, failed...)))}
	for _, w := range []replicaAnswer{{Batch: 7, Version: 3}, {Batch: 7, Version: 3, Error: "ValueError: boom"}} {
		if got, err := l.recv(); err != nil || got != w {
			t.Fatalf("read back %+v, %v; want %+v", got, err, w)
		}
	}
	if _, err := l.recv(); !errors.Is(err, errLaneClosed) {
		t.Fatalf("past the last frame: %v, want errLaneClosed", err)
	}
}

// FuzzLaneAnswer: any bytes from a replica's answers FIFO are read as
// answers or refused with an error, never a panic; what is read encodes
// back to the bytes it was read from.
func FuzzLaneAnswer(f *testing.F) {
	f.Add(appendLaneAnswer(nil, replicaAnswer{Batch: 7, Version: 3}))
	f.Add(appendLaneAnswer(nil, replicaAnswer{Batch: 1, Version: 2, Error: "boom"}))
	f.Add(append(appendLaneAnswer(nil, replicaAnswer{Batch: 1}), 1, 2, 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		l := &lane{r: bufio.NewReader(bytes.NewReader(data))}
		pos := 0
		for {
			ans, err := l.recv()
			if err != nil {
				return
			}
			enc := appendLaneAnswer(nil, ans)
			if !bytes.Equal(enc, data[pos:pos+len(enc)]) {
				t.Fatalf("read %+v from %x, which encodes as %x", ans, data[pos:], enc)
			}
			pos += len(enc)
		}
	})
}

// appendLaneAnswer appends ans's answer frame to b, as a replica writes
// it (python/tensorwire/replica.py's _lane_answer): the tests' replicas and
// the golden bytes. An error longer than maxLaneError is cut there.
func appendLaneAnswer(b []byte, ans replicaAnswer) []byte {
	e := ans.Error
	if len(e) > maxLaneError {
		e = e[:maxLaneError]
	}
	b = binary.LittleEndian.AppendUint64(b, ans.Batch)
	b = binary.LittleEndian.AppendUint64(b, ans.Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return append(b, e...)
}
