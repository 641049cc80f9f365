package serve

import (
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The golden tests pin the serve service's messages byte for byte: one
// example of every request and response, each field set, whose bytes are
// testdata/wire/messages.hex. The Python client
// (python/tests/test_golden_services.py) writes and reads the same bytes,
// and docs/protocol.md ("Services on top") shows them. A change here is a
// protocol change. (The bell's ring and records are files, pinned by
// bell_test.go.)

// goldenIn and goldenOut are the wire forms of two rows of inputs and of
// outputs sent as bytes, as both clients write them (rpc's own goldens pin
// the TD's form; here it is a field like any other).
const (
	goldenIn = `85
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
	goldenOut = `85
		a5 "batch" 91 02
		a7 "entries" 91 86
		  a4 "data" c0
		  a5 "dtype" ab "torch.int64"
		  a3 "key" 91 a6 "action"
		  a4 "kind" a6 "tensor"
		  a3 "ref" c0
		  a5 "shape" 91 02
		a8 "gathered" c2
		a3 "out" c2
		a4 "rows" c0`
)

// goldenClient is a registration's id, as the node draws them.
const goldenClient = 0x1234567890abcdef

func goldenExamples(t *testing.T) []svctest.Example {
	return []svctest.Example{
		// serve.stats's request is serve.info's.
		{Name: "serve.info request", V: infoRequest{Name: "policy"}},
		{Name: "serve.info response", V: infoResponse{
			Input:    tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Float32, Shape: []int{3}}},
			Output:   tensordict.RowSchema{{Key: []string{"action"}, DType: memmap.Int64, Shape: []int{}}},
			MaxBatch: 256, Replicas: 2, Policy: "max_delay=2ms", LeaseMS: 30000, Version: 3}},
		{Name: "serve.register request", V: registerRequest{Name: "policy", Prefix: "clients/a", Slots: 512, Ring: true}},
		{Name: "serve.register response", V: registerResponse{Client: goldenClient, LeaseMS: 30000, Bell: "bells/policy"}},
		// serve.unregister's request is serve.renew's, and both answer
		// with an empty map, as serve.failure does when it does not fail.
		{Name: "serve.renew request", V: clientRequest{Name: "policy", Client: goldenClient}},
		{Name: "serve.renew response", V: rpc.Empty{}},
		{Name: "serve.predict request, bytes", V: predictRequest{Name: "policy", N: 2, In: svctest.WireTD(t, goldenIn)}},
		{Name: "serve.predict response, bytes", V: predictResponse{Version: 3, Out: svctest.WireTD(t, goldenOut)}},
		{Name: "serve.predict request, by reference", V: predictRequest{Name: "policy", Client: goldenClient, Start: 300, N: 2}},
		{Name: "serve.predict response, by reference", V: predictResponse{Version: 3}},
		{Name: "serve.stats response", V: Stats{Requests: 1000, QueueFull: 2, Batches: 300, Rows: 998, Failed: 1,
			FailedRows: 4, Replaced: 1, Switches: 2, Forward: 1500 * time.Millisecond, Queued: 5, Version: 3,
			Sizes: []uint64{0, 100, 150, 50}, Clients: 1}},
		{Name: "serve.failure request", V: failureRequest{Name: "policy", Client: goldenClient, Start: 300, Seq: 70000}},
		// serve.replica, the message stream of an attached replica
		// (replica.go): the request, the node's batches, the replica's
		// answers.
		{Name: "serve.replica request, by reference", V: replicaRequest{Name: "policy", Prefix: ".tensorwire-serve/clients/00112233aabbccdd", Window: 2}},
		{Name: "serve.replica request, by reference, with a lane", V: replicaRequest{Name: "policy", Prefix: ".tensorwire-serve/clients/00112233aabbccdd", Window: 1, Lane: true}},
		{Name: "serve.replica request, bytes", V: replicaRequest{Name: "policy", Window: 2}},
		{Name: "serve.replica batch, by reference", V: replicaBatch{Batch: 7, N: 2, Row: 16}},
		{Name: "serve.replica batch 0, the lane's ack", V: laneAck},
		{Name: "serve.replica batch, bytes", V: replicaBatch{Batch: 7, N: 2, In: svctest.WireTD(t, goldenIn)}},
		{Name: "serve.replica answer, by reference", V: replicaAnswer{Batch: 7, Version: 3}},
		{Name: "serve.replica answer, bytes", V: replicaAnswer{Batch: 7, Version: 3, Out: svctest.WireTD(t, goldenOut)}},
		{Name: "serve.replica answer, error", V: replicaAnswer{Batch: 7, Version: 3, Error: "ValueError: boom"}},
	}
}

// TestGolden_Messages: every message keeps its bytes, and reads back.
func TestGolden_Messages(t *testing.T) {
	svctest.CheckGolden(t, goldenExamples(t))
}

// TestGolden_ProtocolDoc: docs/protocol.md shows the same bytes.
func TestGolden_ProtocolDoc(t *testing.T) {
	svctest.CheckGoldenDoc(t, "../docs/protocol.md", "serve")
}

// TestGolden_PythonIntegers: go-msgpack writes an unsigned field in its
// unsigned form, the Python client every integer in its signed one; the
// node reads the Python client's registration ids the same.
func TestGolden_PythonIntegers(t *testing.T) {
	for _, name := range []string{"serve.renew request", "serve.predict request, by reference"} {
		svctest.CheckGoldenSigned(t, goldenExamples(t), name, goldenClient)
	}
	svctest.CheckGoldenSigned(t, goldenExamples(t), "serve.failure request", goldenClient, 70000)
}
