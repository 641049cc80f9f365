//go:build !linux

package serve

// bellSupported is false off Linux: requests by reference are calls.
const bellSupported = false
