package serve

// bellSupported: requests by reference ring a bell in shared memory
// (bell.go) on Linux, where futexes work on words of shared mappings.
const bellSupported = true
