// Package faulttest is tensorwire's fault suite: real processes on separate
// network addresses (Linux network namespaces joined by a bridge, see
// internal/testkit/netns) that are killed, cut off and attacked while they work,
// and checks that nothing acknowledged is lost, nothing torn is returned,
// and no node stops serving its honest clients.
//
// The package holds tests only; docs/reliability.md says what each scenario
// promises and quotes a run. It needs root for the namespaces; elsewhere its
// tests say so and skip. The two-page-cache scenarios (twocache_test.go,
// issue 23) need no namespaces but FUSE views of one folder
// (internal/testkit/twoview: bindfs, and python3-fusepy for one of them), and skip
// without them, or fail where the environment variable CI is set. Run it
// with
//
//	go test ./faulttest/              # the short mode CI runs
//	go test -short ./faulttest/       # skips every scenario (the quick loop)
//	go test -tags soak -timeout 1h ./faulttest/   # minutes of load per scenario
package faulttest
