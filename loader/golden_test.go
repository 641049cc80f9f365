package loader

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The golden tests pin the loader service's messages byte for byte: one
// example of every request, response and stream message, each field set,
// whose bytes are testdata/wire/messages.hex. The Python client
// (python/tests/test_golden_services.py) writes and reads the same bytes,
// and docs/protocol.md ("Services on top") shows them. A change here is a
// protocol change. (The ring's files are pinned by their own tests.)

// goldenRows is the wire form of a batch's rows sent as bytes (rpc's own
// goldens pin the TD's form; here it is a field like any other).
const goldenRows = `85
	a5 "batch" 91 02
	a7 "entries" 91 86
	  a4 "data" c0
	  a5 "dtype" ab "torch.uint8"
	  a3 "key" 91 a6 "images"
	  a4 "kind" a6 "tensor"
	  a3 "ref" c0
	  a5 "shape" 93 02 1c 1c
	a8 "gathered" c2
	a3 "out" c2
	a4 "rows" c0`

// goldenRing is a ring's id.
const goldenRing = "0123456789abcdef0123456789abcdef"

func goldenExamples(t *testing.T) []svctest.Example {
	return []svctest.Example{
		{Name: "loader.join request", V: joinRequest{Name: "mnist", Batch: 64, Bytes: true}},
		{Name: "loader.join response", V: joinResponse{Ring: goldenRing, Consumer: 3, Epoch: 2, Prefix: "loaders/mnist",
			Schema: tensordict.RowSchema{
				{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{28, 28}},
				{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{}}},
			Samples: 60000, Batch: 256, Slots: 8, HeartbeatMS: 5000}},
		{Name: "loader.consume request", V: consumeRequest{Name: "mnist", Ring: goldenRing, Consumer: 3, Epoch: 2, Index: 0, Bytes: true}},
		{Name: "loader.consume message, bytes", V: batchMessage{
			Batch: announcement{Epoch: 2, Index: 5, Count: 235, Slot: 5, Word: 1000<<2 | statePublished, Rows: 2},
			Rows:  svctest.WireTD(t, goldenRows)}},
		{Name: "loader.consume message, by reference", V: batchMessage{
			Batch: announcement{Epoch: 2, Index: 234, Count: 235, Slot: 2, Word: 1229<<2 | statePublished, Rows: 96}}},
		{Name: "loader.consume ack", V: ackMessage{Epoch: 2, Index: 6}},
		{Name: "loader.leave request", V: leaveRequest{Name: "mnist", Ring: goldenRing, Consumer: 3}},
		{Name: "loader.leave response", V: rpc.Empty{}},
		{Name: "loader.join response, a producer process's", V: joinResponse{Ring: goldenRing, Consumer: 3, Epoch: 2, Prefix: "loaders/mnist",
			Schema:  tensordict.RowSchema{{Key: []string{"0"}, DType: memmap.Uint8, Shape: []int{28, 28}}},
			Samples: 2, Batch: 2, Slots: 8, HeartbeatMS: 5000, Layout: LayoutTuple}},
		{Name: "loader.produce request", V: produceRequest{Name: "mnist",
			Schema: tensordict.RowSchema{{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{28, 28}}},
			Layout: LayoutDict, Samples: 2, Batch: 2, Bytes: true}},
		{Name: "loader.produce message, attached", V: produceMessage{Attached: &attachment{Ring: goldenRing, Prefix: "mnist/ring-" + goldenRing[:16], Slots: 8, Epoch: 2}}},
		{Name: "loader.produce message, grant", V: produceMessage{Grant: &grant{Epoch: 2, Index: 0, Count: 1, Slot: 5, Rows: 2}}},
		{Name: "loader.produce published, bytes", V: publishedMessage{Published: &grant{Epoch: 2, Index: 0, Count: 1, Slot: 5, Rows: 2},
			Rows: svctest.WireTD(t, goldenRows)}},
		{Name: "loader.produce published, by reference", V: publishedMessage{Published: &grant{Epoch: 2, Index: 0, Count: 1, Slot: 5, Rows: 2}}},
		{Name: "loader.produce error", V: publishedMessage{Error: "ValueError: sample 37 is corrupt"}},
		{Name: "loader.stats request", V: statsRequest{Name: "mnist"}},
		{Name: "loader.stats response", V: Stats{Consumers: 2, Joined: 4, Dropped: 1, DroppedSlow: 1, Left: 1,
			Epoch: 2, Running: true, Window: true, Published: 475, InEpoch: 5, Epochs: 2, CutShort: 1,
			WaitNS: 1500000, Samples: 60000, Batch: 256, Slots: 8, Failed: "source: read: EIO"}},
	}
}

// TestGolden_Messages: every message keeps its bytes, and reads back.
func TestGolden_Messages(t *testing.T) {
	svctest.CheckGolden(t, goldenExamples(t))
}

// TestGolden_ProtocolDoc: docs/protocol.md shows the same bytes.
func TestGolden_ProtocolDoc(t *testing.T) {
	svctest.CheckGoldenDoc(t, "../docs/protocol.md", "loader")
}
