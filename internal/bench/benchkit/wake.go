package benchkit

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Wake is what a wake-up costs on this machine: the p50 round trip of one
// byte between two threads over a pipe each way, each thread asleep in
// read(2) until the other writes, so every leg is a sleeping thread woken
// (MeasureWake). Across is with the threads on two different CPUs, which
// the kernel wakes with an interrupt to the other CPU (and, when that CPU
// is idle, brings out of its halt); Same with both on one CPU. Across is
// zero where this process may run on one CPU only.
//
// It is the machine reference beside memcpy for figures bound by wake-ups
// rather than bytes (a small call, a 1 MiB collective, a prediction): the
// same code measured on two days can differ by what the machine charges
// per wake-up, and a virtual machine can charge many times what bare
// metal does (docs/benchmarks.md, "How fast this machine wakes").
type Wake struct {
	Across time.Duration
	Same   time.Duration
}

// String gives Across and Same in microseconds, for a report's footer.
func (w Wake) String() string {
	if w.Across == 0 {
		return fmt.Sprintf("%.1f us on one CPU (one CPU to run on: none across)", us(w.Same))
	}
	return fmt.Sprintf("%.1f us across two CPUs, %.1f us on one", us(w.Across), us(w.Same))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// wakeRounds is how many round trips MeasureWake times for each of its two
// figures, after a tenth as many untimed: about 0.2 s on a virtual machine
// whose cross-CPU round trip takes 80 us, a tenth of that on bare metal.
const wakeRounds = 2000

// wakeJSON is Wake as JSON has it: microseconds.
type wakeJSON struct {
	AcrossUs float64 `json:"across_us"`
	SameUs   float64 `json:"same_us"`
}

// MarshalJSON writes w as {"across_us": A, "same_us": S}, to 0.1 us.
func (w Wake) MarshalJSON() ([]byte, error) {
	round := func(d time.Duration) float64 { return math.Round(us(d)*10) / 10 }
	return json.Marshal(wakeJSON{round(w.Across), round(w.Same)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (w *Wake) UnmarshalJSON(b []byte) error {
	var j wakeJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	w.Across = time.Duration(j.AcrossUs * float64(time.Microsecond))
	w.Same = time.Duration(j.SameUs * float64(time.Microsecond))
	return nil
}

// WakeReference measures Wake for a report, best before the run starts
// its processes (the idle machine's figure): the figures, nil where they
// cannot be measured, and the footer line that gives them or says why not.
func WakeReference() (*Wake, string) {
	const what = "wake-up (a byte's round trip between two threads asleep in read, a pipe each way): "
	w, err := MeasureWake()
	if err != nil {
		return nil, what + "not measured: " + err.Error()
	}
	return &w, what + w.String()
}
