package faulttest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The episode workload (issue 31): actors append the steps of their
// episodes to a buffer with a trajectory key, one to four steps a call,
// several actors interleaved, while samplers take slices of episodes. A
// step says which it is in every field: "episode" (its trajectory key),
// "step" (its index in the episode) and "obs", epObsWidth values each a
// function of both (a row mixed from two steps, or half written, is torn).
// An episode's key is
//
//	(actor+1)<<40 | incarnation<<20 | n
//
// so an actor killed and restarted starts new episodes; an actor whose
// node is killed carries on its episode. Actors log, one write(2) a line,
// "begin EPISODE T K" before a call that appends steps [T, T+K) and "ack
// EPISODE T K" after it returned nil; a stat line names the episode and
// step in progress ("ep=E t=T"), so that a test can tell which episodes a
// node kill fell in. A Python actor (testdata/episode_actor.py) speaks the
// same protocol.
const epObsWidth = 4

func epObs(ep, step int64, j int) int64 { return ep*31 + step*7 + int64(j) }

// episodeSteps returns steps [from, to) of episode ep.
func episodeSteps(ep int64, from, to int) *tensordict.TensorDict {
	n := to - from
	eps, st, obs := make([]int64, n), make([]int64, n), make([]int64, n*epObsWidth)
	for i := range n {
		eps[i], st[i] = ep, int64(from+i)
		for j := range epObsWidth {
			obs[i*epObsWidth+j] = epObs(ep, st[i], j)
		}
	}
	td, _ := tensordict.New(n)
	e, _ := tensordict.FromSlice(eps, n)
	s, _ := tensordict.FromSlice(st, n)
	o, _ := tensordict.FromSlice(obs, n, epObsWidth)
	td.Set("episode", e)
	td.Set("step", s)
	td.Set("obs", o)
	return td
}

// stepColumns returns a TensorDict's episode and step columns, and the
// first row whose obs disagrees with them (-1: none).
func stepColumns(td *tensordict.TensorDict) (eps, st []int64, torn int, err error) {
	var cols [3][]int64
	for i, k := range []string{"episode", "step", "obs"} {
		t, err := td.Tensor(k)
		if err != nil {
			return nil, nil, 0, err
		}
		if cols[i], err = tensordict.Values[int64](t); err != nil {
			return nil, nil, 0, err
		}
	}
	eps, st, obs := cols[0], cols[1], cols[2]
	for i := range eps {
		for j := range epObsWidth {
			if obs[i*epObsWidth+j] != epObs(eps[i], st[i], j) {
				return eps, st, i, nil
			}
		}
	}
	return eps, st, -1, nil
}

// checkSliceSample checks a sample of slices of sliceLen: each slice is
// its info's episode, consecutive steps, no row torn.
func checkSliceSample(td *tensordict.TensorDict, info replay.SliceInfo, sliceLen int) error {
	eps, st, torn, err := stepColumns(td)
	if err != nil {
		return err
	}
	if torn >= 0 {
		return fmt.Errorf("row %d torn: episode %d step %d", torn, eps[torn], st[torn])
	}
	if len(eps) != sliceLen*len(info.Episodes) {
		return fmt.Errorf("%d rows for %d slices of %d", len(eps), len(info.Episodes), sliceLen)
	}
	for s, ep := range info.Episodes {
		for i := s * sliceLen; i < (s+1)*sliceLen; i++ {
			if eps[i] != ep {
				return fmt.Errorf("slice %d of episode %d holds a step of episode %d", s, ep, eps[i])
			}
			if i > s*sliceLen && st[i] != st[i-1]+1 {
				return fmt.Errorf("slice %d of episode %d: step %d after step %d", s, ep, st[i], st[i-1])
			}
		}
	}
	return nil
}

func init() {
	roles["actor"] = runActor
	roles["slicer"] = runSlicer
}

// runActor is the Go actor role: episodes of 20 to 80 steps, appended one
// to four steps a call, until stopped.
func runActor(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("actor", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	actor := fs.Int("actor", 0, "this actor's number")
	inc := fs.Int("inc", 0, "this run's incarnation")
	logPath := fs.String("log", "", "the step log")
	pace := fs.Duration("pace", 0, "pause between calls")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logf, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	c, st, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	for n := 0; ctx.Err() == nil; n++ {
		ep := int64(*actor+1)<<40 | int64(*inc)<<20 | int64(n)
		length := 20 + rng.IntN(61)
		for t := 0; t < length && ctx.Err() == nil; {
			k := min(1+rng.IntN(4), length-t)
			st.setProgress(ep, t)
			if _, err := fmt.Fprintf(logf, "begin %d %d %d\n", ep, t, k); err != nil {
				return err
			}
			start := time.Now()
			_, err := c.Extend(ctx, episodeSteps(ep, t, t+k))
			if ctx.Err() != nil {
				return nil // stopped: this call's fate is unknown, as if killed
			}
			st.record(err, start, time.Since(start), 0)
			if err != nil {
				return fmt.Errorf("episode %d steps [%d, %d): %w", ep, t, t+k, err)
			}
			if _, err := fmt.Fprintf(logf, "ack %d %d %d\n", ep, t, k); err != nil {
				return err
			}
			t += k
			if *pace > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(*pace):
				}
			}
		}
	}
	return nil
}

// runSlicer is the sampler role: -batch/8 slices of 8 steps a call, each
// checked, until stopped. A bad slice (torn, crossing an episode, out of
// order) is counted as torn and described in last_err.
func runSlicer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("slicer", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, st, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	spec := replay.SliceSpec{SliceLen: 8, NumSlices: max(cf.batch/8, 1)}
	for ctx.Err() == nil {
		start := time.Now()
		td, info, err := c.SampleSlices(ctx, spec)
		if ctx.Err() != nil {
			break
		}
		st.record(err, start, time.Since(start), 0)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		bad := checkSliceSample(td, info, spec.SliceLen)
		st.mu.Lock()
		st.rows += len(info.Indices)
		if bad != nil {
			st.torn++
			st.lastErr = bad.Error()
		}
		st.mu.Unlock()
	}
	return nil
}

// episodeLog is what the actors' logs say, by episode: the calls begun
// (first step -> steps) and the ones acknowledged.
type episodeLog struct {
	begun map[int64]map[int]int
	acked map[int64]map[int]bool
}

func readEpisodeLogs(paths ...string) (*episodeLog, error) {
	l := &episodeLog{begun: map[int64]map[int]int{}, acked: map[int64]map[int]bool{}}
	for _, p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var ep int64
			var t, k int
			kind, rest, _ := strings.Cut(sc.Text(), " ")
			if _, err := fmt.Sscanf(rest, "%d %d %d", &ep, &t, &k); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %q: %w", p, sc.Text(), err)
			}
			switch kind {
			case "begin":
				if l.begun[ep] == nil {
					l.begun[ep], l.acked[ep] = map[int]int{}, map[int]bool{}
				}
				l.begun[ep][t] = k
			case "ack":
				if l.begun[ep][t] != k {
					f.Close()
					return nil, fmt.Errorf("%s: ack of episode %d step %d with no begin", p, ep, t)
				}
				l.acked[ep][t] = true
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// heldEpisode is an episode as a reopened buffer knows it: the step
// column at each of its slots, in its order (-1 for a hole).
type heldEpisode struct {
	steps []int64
}

// heldEpisodes opens the buffer at prefix (its node stopped or killed), as
// a node restarting does, and returns its episodes with each step's
// index read from the storage at the slots the buffer lists, checking
// that each slot holds a whole step of that episode.
func heldEpisodes(prefix string) (map[int64]heldEpisode, error) {
	b, err := replay.Open(prefix)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	td, err := tensordict.LoadMemmap(filepath.Join(prefix, "storage"))
	if err != nil {
		return nil, err
	}
	defer td.Close()
	eps, st, _, err := stepColumns(td)
	if err != nil {
		return nil, err
	}
	obsT, _ := td.Tensor("obs")
	obs, _ := tensordict.Values[int64](obsT)
	out := map[int64]heldEpisode{}
	for _, e := range b.Episodes() {
		h := heldEpisode{steps: make([]int64, len(e.Slots))}
		for i, s := range e.Slots {
			if s < 0 {
				h.steps[i] = -1
				continue
			}
			if eps[s] != e.ID {
				return nil, fmt.Errorf("episode %d lists slot %d, which holds a step of episode %d", e.ID, s, eps[s])
			}
			for j := range epObsWidth {
				if obs[s*epObsWidth+j] != epObs(eps[s], st[s], j) {
					return nil, fmt.Errorf("episode %d lists slot %d, a torn step", e.ID, s)
				}
			}
			h.steps[i] = st[s]
		}
		out[e.ID] = h
	}
	return out, nil
}

// episodeVerdict compares the episodes a reopened buffer knows with what
// the actors logged.
type episodeVerdict struct {
	Episodes   int // episodes begun
	Acked      int // steps acknowledged
	Held       int // steps the buffer's episodes hold
	Lost       int // acknowledged steps not in their episode: must be 0
	Misplaced  int // episodes whose steps are not 0, 1, 2, ... in order: must be 0
	Partial    int // episodes ending inside a call: must be 0
	Unknown    int // episodes the buffer knows that no actor began: must be 0
	InFlight   int // episodes ending with a whole call that was never acknowledged (allowed)
	Overwrites int // episodes that lost steps at their start to overwriting (allowed only when asked)
}

func (v episodeVerdict) ok() bool {
	return v.Lost == 0 && v.Misplaced == 0 && v.Partial == 0 && v.Unknown == 0 && v.Acked > 0
}

// judgeEpisodes: every acknowledged step is in its episode at its place;
// an episode holds steps 0, 1, ..., m-1 (or, with overwritten set, a run
// of consecutive steps ending at m-1) ending at a call's end, and beyond
// the acknowledged steps at most whole calls not acknowledged.
func judgeEpisodes(l *episodeLog, held map[int64]heldEpisode, overwritten bool) episodeVerdict {
	v := episodeVerdict{Episodes: len(l.begun)}
	for ep, calls := range l.begun {
		ackedEnd := 0
		for t := range l.acked[ep] {
			v.Acked += calls[t]
			ackedEnd = max(ackedEnd, t+calls[t])
		}
		h, ok := held[ep]
		if !ok {
			if ackedEnd > 0 && !overwritten {
				v.Lost += ackedEnd
			}
			continue
		}
		v.Held += len(h.steps)
		first := int64(0)
		if len(h.steps) > 0 {
			first = h.steps[0]
		}
		if first != 0 {
			if overwritten && first > 0 {
				v.Overwrites++
			} else {
				v.Misplaced++
				continue
			}
		}
		inOrder := true
		for i, s := range h.steps {
			if s != first+int64(i) {
				inOrder = false
			}
		}
		if !inOrder {
			v.Misplaced++
			continue
		}
		m := int(first) + len(h.steps)
		if m < ackedEnd {
			v.Lost += ackedEnd - m
			continue
		}
		// The end is a call's end; past the acknowledged steps, calls whole.
		ends := false
		for t, k := range calls {
			if t+k == m {
				ends = true
			}
		}
		switch {
		case m == ackedEnd:
		case !ends:
			v.Partial++
		default:
			v.InFlight++
		}
	}
	for ep := range held {
		if _, ok := l.begun[ep]; !ok {
			v.Unknown++
		}
	}
	return v
}
