package store

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// The golden tests pin the store service's messages byte for byte: one
// example of every request, response and stream message, each field set,
// whose bytes are testdata/wire/messages.hex. The Python client
// (python/tests/test_golden_services.py) writes and reads the same bytes,
// and docs/protocol.md ("Services on top") shows them. A change here is a
// protocol change.

// goldenTD is the wire form of a value sent as bytes: {"obs": float32
// [2, 3]}, of batch size [2], as both clients write it (rpc's own goldens
// pin the TD's form; here it is a field like any other).
const goldenTD = `85
	a5 "batch" 91 02
	a7 "entries" 91 86
	  a4 "data" c0
	  a5 "dtype" ad "torch.float32"
	  a3 "key" 91 a3 "obs"
	  a4 "kind" a6 "tensor"
	  a3 "ref" c0
	  a5 "shape" 92 02 03
	a8 "gathered" c2
	a3 "out" c2
	a4 "rows" c0`

// goldenReq is the request id of the examples' mutating calls.
var goldenReq = reqID{Client: 0x1234567890abcdef, Seq: 7}

func goldenExamples(t *testing.T) []svctest.Example {
	td := func() *rpc.TD { return svctest.WireTD(t, goldenTD) }
	return []svctest.Example{
		// store.list's and store.stats's requests are store.info's.
		{Name: "store.info request", V: storeRequest{Store: "main"}},
		{Name: "store.info response", V: infoResponse{ID: "0123456789abcdef0123456789abcdef", Dir: "stores/main",
			InlineBytes: 4096, MaxValueBytes: 1 << 30, LeaseMS: 30000, GetTimeoutMS: 60000, NoSync: true}},
		// store.append's request and response are store.put's.
		{Name: "store.put request", V: putRequest{Store: "main", Bin: "data",
			Value: valueMsg{TD: td(), Staged: ""}, Req: goldenReq}},
		{Name: "store.put request, staged", V: putRequest{Store: "main", Bin: "data",
			Value: valueMsg{Staged: "staging/0123456789abcdef0123456789abcdef"}, Req: goldenReq}},
		{Name: "store.put response", V: revResponse{Rev: 42}},
		// store.extend's response is store.put's.
		{Name: "store.extend request", V: extendRequest{Store: "main", Bin: "data",
			Values: []valueMsg{{TD: td()}, {TD: td()}}, Req: goldenReq}},
		{Name: "store.take request", V: takeRequest{Store: "main", Bin: "data", Take: 0xfedcba9876543210, Refs: true}},
		{Name: "store.take response", V: takeResponse{Take: 0xfedcba9876543210, Rev: 43, Items: []itemMsg{
			{TD: td()}, {Path: "values/0123456789abcdef"}}}},
		{Name: "store.ack request", V: ackRequest{Store: "main", Take: 0xfedcba9876543210, Drop: true}},
		{Name: "store.ack response", V: revResponse{Rev: 44}},
		// One bin: Go writes a map's keys in no set order.
		{Name: "store.list response", V: listResponse{Bins: map[string]int{"data": 3}, Rev: 44}},
		{Name: "store.delete request", V: deleteRequest{Store: "main", Bin: "data", Req: goldenReq}},
		{Name: "store.delete response", V: revResponse{Rev: 45}},
		{Name: "store.publish request", V: publishRequest{Store: "main", Name: "params",
			Value: valueMsg{TD: td()}, Req: goldenReq}},
		{Name: "store.publish response", V: publishResponse{Version: 3, Rev: 46}},
		{Name: "store.read request", V: readRequest{Store: "main", Name: "params", After: 2, Wait: true, Refs: true}},
		{Name: "store.read response", V: readResponse{Version: 3, Lease: 9, LeaseMS: 10000,
			Path: "values/00000000000000a1"}},
		{Name: "store.read response, bytes", V: readResponse{Version: 3, TD: td()}},
		{Name: "store.renew request", V: renewRequest{Store: "main", Leases: []leaseRef{{ID: 9, Name: "params", Version: 3}}}},
		{Name: "store.renew response", V: renewResponse{Lost: []uint64{9}}},
		{Name: "store.release request", V: releaseRequest{Store: "main", Leases: []uint64{9}}},
		{Name: "store.release response", V: rpc.Empty{}},
		{Name: "store.watch request", V: watchRequest{Store: "main", ID: "0123456789abcdef0123456789abcdef",
			Prefix: "da", After: 40}},
		{Name: "store.watch message", V: watchMessage{Events: []Event{
			{Revision: 41, Op: OpAppend, Name: "data", Items: 3},
			{Revision: 46, Op: OpPublish, Name: "params", Version: 3}}, Seen: 47}},
		{Name: "store.stats response", V: Stats{Revision: 47, Bins: 1, Items: 3, InlineBytes: 72, Params: 1,
			Versions: 2, Leases: 1, Gets: 1, LogBytes: 8192, Missing: 1, Stopped: "failed"}},
	}
}

// TestGolden_Messages: every message keeps its bytes, and reads back.
func TestGolden_Messages(t *testing.T) {
	svctest.CheckGolden(t, goldenExamples(t))
}

// TestGolden_ProtocolDoc: docs/protocol.md shows the same bytes.
func TestGolden_ProtocolDoc(t *testing.T) {
	svctest.CheckGoldenDoc(t, "../docs/protocol.md", "store")
}

// TestGolden_PythonIntegers: go-msgpack writes an unsigned field in its
// unsigned form, the Python client every integer in its signed one; the
// node reads the Python client's request ids the same.
func TestGolden_PythonIntegers(t *testing.T) {
	for _, name := range []string{"store.put request", "store.put request, staged", "store.delete request", "store.publish request", "store.extend request"} {
		svctest.CheckGoldenSigned(t, goldenExamples(t), name, goldenReq.Client)
	}
}
