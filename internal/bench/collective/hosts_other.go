//go:build !unix

package collective

import (
	"errors"
	"fmt"
)

// netnsHosts: network namespaces are Linux's; --hosts netns is refused.
func netnsHosts(int) ([]rankHost, func(), error) {
	return nil, nil, fmt.Errorf("--hosts netns needs Linux network namespaces: %w", errors.ErrUnsupported)
}
