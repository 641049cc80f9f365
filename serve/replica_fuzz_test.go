package serve

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// FuzzReplicaAnswer: whatever an attached replica answers (another batch's
// number, outputs of any rows, dtype, width or key, an error, none), the
// request gets the replica's outputs when they fit the schema and
// ErrForward otherwise, never a hang; and the node goes on serving: a
// well-behaved replica attached after answers.
func FuzzReplicaAnswer(f *testing.F) {
	f.Add(int8(0), uint8(2), uint8(6), uint8(2), "y", "", true)      // a right answer
	f.Add(int8(1), uint8(2), uint8(6), uint8(2), "y", "", true)      // another batch's number
	f.Add(int8(0), uint8(3), uint8(6), uint8(2), "y", "", true)      // a row too many
	f.Add(int8(0), uint8(2), uint8(9), uint8(2), "y", "", true)      // int64
	f.Add(int8(0), uint8(2), uint8(6), uint8(3), "y", "", true)      // 3 wide
	f.Add(int8(0), uint8(2), uint8(6), uint8(2), "z", "", true)      // another key
	f.Add(int8(0), uint8(2), uint8(6), uint8(2), "y", "boom", true)  // an error
	f.Add(int8(0), uint8(2), uint8(6), uint8(2), "y", "", false)     // no outputs
	f.Add(int8(-7), uint8(0), uint8(0), uint8(0), "", "\x00", false) // odd everything
	f.Fuzz(func(t *testing.T, delta int8, rows, dtype, width uint8, key, msg string, withOut bool) {
		if rows > 64 || width > 64 {
			return
		}
		n := serveModel(t, "", attachedConfig(4))
		st := openReplica(context.Background(), t, n.addr, 0)
		dt := memmap.DType(dtype)
		if !dt.Valid() || key == "" { // no TD of them: the model's dtype and key
			dt, key = memmap.Float32, "y"
		}
		go func() {
			b, err := st.Recv(context.Background())
			if err != nil {
				return
			}
			ans := replicaAnswer{Batch: b.Batch + uint64(int64(delta)), Version: 1, Error: msg}
			if withOut {
				y, err := tensordict.Zeros(dt, int(rows), int(width))
				if err != nil {
					return
				}
				out, _ := tensordict.New(int(rows))
				if err := out.Set(key, y); err != nil {
					return
				}
				ans.Out = &rpc.TD{TensorDict: out}
			}
			st.Send(context.Background(), ans)
		}()
		waitAttached(t, n.m, 1)
		cl := dial(t, n.addr, "", "bytes")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _, err := cl.Predict(ctx, rowsOf(t, 1, 2))
		fits := delta == 0 && msg == "" && withOut && rows == 2 && width == 2 && key == "y" && dt == memmap.Float32
		switch {
		case fits && err != nil:
			t.Fatalf("a right answer: %v", err)
		case !fits && !errors.Is(err, ErrForward):
			t.Fatalf("a wrong answer: %v, want ErrForward", err)
		}
		st.Close()
		attachReplica(t, n.addr, 2, nil)
		if _, v, err := cl.Predict(ctx, rowsOf(t, 1, 2)); err != nil || v != 2 {
			t.Fatalf("after: version %d, %v", v, err)
		}
	})
}
