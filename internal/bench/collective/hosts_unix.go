//go:build unix

package collective

import (
	"fmt"

	"github.com/tensorwire/tensorwire/internal/testkit/netns"
)

// netnsHosts makes n network-namespace hosts for --hosts netns, and a
// function that removes them.
func netnsHosts(n int) ([]rankHost, func(), error) {
	if err := netns.Available(); err != nil {
		return nil, nil, fmt.Errorf("--hosts netns needs network namespaces (root, iproute2): %w", err)
	}
	nw, err := netns.Make()
	if err != nil {
		return nil, nil, fmt.Errorf("--hosts netns: %w", err)
	}
	var hosts []rankHost
	for r := range n {
		h, err := nw.Host(fmt.Sprintf("rank%d", r))
		if err != nil {
			nw.Close()
			return nil, nil, fmt.Errorf("--hosts netns: %w", err)
		}
		hosts = append(hosts, h)
	}
	return hosts, func() { nw.Close() }, nil
}
