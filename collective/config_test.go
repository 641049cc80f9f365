package collective

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
)

// TestConfig_Validate: a Config that cannot form a communicator is
// refused with ErrConfig naming the field and what it wants, before any
// socket is opened.
func TestConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "": valid
	}{
		{"one rank", Config{Size: 1, Addr: "127.0.0.1:1"}, ""},
		{"peers", Config{Rank: 1, Size: 2, Peers: []string{"h:1", "h:2"}, Transport: TCP}, ""},
		{"no ranks", Config{Addr: "127.0.0.1:1"}, "size 0: at least one rank"},
		{"too many", Config{Size: MaxSize + 1, Addr: "127.0.0.1:1"}, "at most 1024 ranks"},
		{"rank out of range", Config{Rank: 2, Size: 2, Addr: "127.0.0.1:1"}, "rank 2 is not in [0, 2)"},
		{"no rendezvous", Config{Size: 1}, "no rendezvous"},
		{"both", Config{Size: 1, Addr: "h:1", Peers: []string{"h:1"}}, "both Addr and Peers"},
		{"peers short", Config{Size: 2, Peers: []string{"h:1"}}, "1 peers for 2 ranks"},
		{"transport", Config{Size: 1, Addr: "h:1", Transport: "rdma"}, `transport "rdma"`},
		{"address", Config{Size: 1, Addr: "nowhere"}, `address "nowhere"`},
	} {
		err := tc.cfg.Validate()
		svctest.WantConfigError(t, tc.name, err, tc.want, "", ErrConfig)
	}
	if d := DefaultConfig(); d.Logger == nil || d.Validate() == nil {
		t.Errorf("DefaultConfig() = %+v: want a Logger, and no rendezvous refused", d)
	}
}
