// Package progress draws a progress bar for long CLI work on a terminal, and
// prints a plain line every few seconds when the output is not one (CI logs).
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Bar reports progress towards a total number of units (bytes, rows). Its
// methods are safe for concurrent use. A nil *Bar does nothing.
type Bar struct {
	mu       sync.Mutex
	w        io.Writer
	label    string
	unit     string // "B" formats as bytes, anything else as a plain count
	total    int64
	done     int64
	start    time.Time
	last     time.Time
	every    time.Duration
	terminal bool
}

// New returns a Bar writing to w. On a terminal it redraws one line at most
// ten times a second; elsewhere it prints a line at most every five seconds.
func New(w io.Writer, label, unit string, total int64) *Bar {
	b := &Bar{w: w, label: label, unit: unit, total: total, start: time.Now(), every: 5 * time.Second}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		b.terminal, b.every = true, 100*time.Millisecond
	}
	return b
}

// Add records n more units done.
func (b *Bar) Add(n int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	if now := time.Now(); now.Sub(b.last) >= b.every {
		b.last = now
		b.draw(false)
	}
}

// Done draws the final state and ends the line.
func (b *Bar) Done() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.draw(true)
}

// Reader returns r counting what is read from it into the bar.
func (b *Bar) Reader(r io.Reader) io.Reader { return &reader{r, b} }

type reader struct {
	r io.Reader
	b *Bar
}

func (r *reader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.b.Add(int64(n))
	return n, err
}

func (b *Bar) draw(final bool) {
	elapsed := time.Since(b.start)
	frac := 1.0
	if b.total > 0 {
		frac = min(1, float64(b.done)/float64(b.total))
	}
	rate := float64(b.done) / max(elapsed.Seconds(), 1e-9)
	line := fmt.Sprintf("%s %3.0f%% %s/%s %s/s %s", b.label, 100*frac,
		b.format(float64(b.done)), b.format(float64(b.total)), b.format(rate), elapsed.Round(100*time.Millisecond))
	if b.terminal {
		const width = 30
		fill := int(frac * width)
		line = fmt.Sprintf("\r%s [%s%s] %s", b.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), line[len(b.label)+1:])
		if final {
			line += "\n"
		}
	} else {
		line += "\n"
	}
	io.WriteString(b.w, line)
}

func (b *Bar) format(v float64) string {
	if b.unit != "B" {
		return fmt.Sprintf("%.0f", v)
	}
	return Bytes(v)
}

// Bytes formats a byte count with a binary unit: "1.5 MiB".
func Bytes(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", v)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
