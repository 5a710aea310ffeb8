package fleet

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package's run if any goroutine outlives its tests: every
// limiter's goroutine, and the client's own, end with Close. The client's
// dialer, against a Redis that is dead when it is closed, sleeps a second
// between tries and ends when it next wakes: the check waits up to 3 s for
// that, polling. (goleak's own wait, under half a second, failed a test that
// ends with Redis dead whenever it ran alone.)
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(3 * time.Second)
		err := goleak.Find()
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
