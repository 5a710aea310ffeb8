//go:build !race

package fleet

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = false
