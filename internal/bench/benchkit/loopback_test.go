package benchkit

import (
	"context"
	"testing"
)

// TestMeasureLoopback: where the CPU time can be read, a loopback stream
// has a rate and costs CPU a byte; the figures are not asserted beyond
// that (a benchmark's job), but a cost of zero or a rate of zero would
// mean the stream or the CPU time was not measured.
func TestMeasureLoopback(t *testing.T) {
	if ProcessCPU() < 0 {
		t.Skip("no CPU time on this system")
	}
	lb, err := MeasureLoopback(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if lb.GBps <= 0 || lb.CPUNsPerByte <= 0 {
		t.Fatalf("%+v: a stream moves bytes and costs CPU", lb)
	}
	t.Logf("%+v", lb)
}
