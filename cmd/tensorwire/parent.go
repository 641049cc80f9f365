package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// watchParentChange is watchExit's fallback where no pidfd can be had
// (why): it looks every 250 ms whether this process's parent is still
// pid, and calls exited once it is not (the parent exited, and this
// process was given another). It fails when pid is not the parent now.
func watchParentChange(ctx context.Context, pid int, exited func(), why error) error {
	if os.Getppid() != pid {
		return fmt.Errorf("process %d cannot be watched here (%v), and it is not this process's parent", pid, why)
	}
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if os.Getppid() != pid {
				exited()
				return
			}
		}
	}()
	return nil
}
