package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started is still
// running at the end: every server, socket reader and timer must be stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
