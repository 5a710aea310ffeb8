package fleet

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run if any goroutine outlives its tests: every
// limiter's goroutine, and the client's own, end with Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
