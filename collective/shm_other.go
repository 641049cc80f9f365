//go:build !linux

package collective

import (
	"context"
	"errors"
)

// Shared mappings need Linux (futexes on shared words): elsewhere every
// communicator uses TCP.

var errNoShm = errors.New("shared mappings need Linux")

const ctlDescRoom = descMax

type shmGroup struct {
	ranks []int
	prog  uint32
	inbox *inbox
}

func makeSessionDir(string, uint64) (string, error)                   { return "", errNoShm }
func openShm(*Comm, string) (*shmGroup, error)                        { return nil, errNoShm }
func (g *shmGroup) attach() error                                     { return errNoShm }
func (g *shmGroup) close()                                            {}
func (g *shmGroup) folder() string                                    { return "" }
func (g *shmGroup) abort()                                            {}
func (g *shmGroup) setPhase(uint32)                                   {}
func (g *shmGroup) setProg(uint32)                                    {}
func (g *shmGroup) waitProgAll(context.Context, uint32, uint32) error { return errNoShm }
func (g *shmGroup) waitAll(context.Context, uint32) error             { return errNoShm }
func (g *shmGroup) putDesc(int, []byte)                               {}
func (g *shmGroup) desc(int, int) (desc, error)                       { return desc{}, errNoShm }
func (g *shmGroup) publish(int, int) ([]byte, error)                  { return nil, errNoShm }
func (g *shmGroup) peerData(int, int, int) ([]byte, error)            { return nil, errNoShm }

func openShmGroup(*Comm, string, int, int) (*shmGroup, error)   { return nil, errNoShm }
func sweepSessions(string)                                      {}
func (g *shmGroup) waitRank(context.Context, int, uint32) error { return errNoShm }

type sharedRef struct{}

func (g *shmGroup) alloc(int) ([]byte, error)                        { return nil, errNoShm }
func (g *shmGroup) free([]byte) error                                { return errNoShm }
func (g *shmGroup) register(string, []byte) error                    { return errNoShm }
func (g *shmGroup) deregister(string) error                          { return errNoShm }
func (g *shmGroup) putRef(int, *call) bool                           { return false }
func (g *shmGroup) locate([]byte) (uint32, int, bool)                { return 0, 0, false }
func (g *shmGroup) deferredPipe(int, kind, int) bool                 { return false }
func (g *shmGroup) exposedInput(int, int, int) ([]byte, bool, error) { return nil, false, nil }
func (g *shmGroup) refs(int, func(int) uint64) ([]sharedRef, bool)   { return nil, false }
func (s *shmRun) sharedReduce([]sharedRef, int) error                { return errNoShm }
func (s *shmRun) sharedReduceScatter([]sharedRef) error              { return errNoShm }
