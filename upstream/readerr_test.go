package upstream

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// After a read error the reader reads on at once if the error came from
// ICMP, however many come in a row; any other error is read past once,
// then each repeat without a reply read between pauses twice as long, up
// to maxReadPause; a reply read ends the streak.
func TestReadErrorPauses(t *testing.T) {
	refused := &os.SyscallError{Syscall: "recvmmsg", Err: syscall.ECONNREFUSED}
	broken := syscall.EBADF
	other := errors.New("something else")
	type step struct {
		err  error
		read bool
		want time.Duration
	}
	icmpStorm := make([]step, 1000)
	for i := range icmpStorm {
		icmpStorm[i] = step{refused, false, 0}
	}
	persistent := []step{{broken, false, 0}}
	for d := minReadPause; d < maxReadPause; d *= 2 {
		persistent = append(persistent, step{broken, false, d})
	}
	persistent = append(persistent, step{broken, false, maxReadPause}, step{broken, false, maxReadPause})
	tests := []struct {
		name  string
		steps []step
	}{
		{"ICMP errors in a row", icmpStorm},
		{"each ICMP kind", []step{{syscall.EHOSTUNREACH, false, 0}, {syscall.ENETUNREACH, false, 0}, {syscall.EHOSTDOWN, false, 0},
			{fmt.Errorf("read: %w", syscall.ECONNREFUSED), false, 0}}},
		{"persistent error, bounded", persistent},
		{"a reply read ends the streak", []step{{other, false, 0}, {other, false, minReadPause}, {other, false, 2 * minReadPause},
			{other, true, 0}, {other, false, minReadPause}}},
		{"ICMP errors neither end nor lengthen the streak", []step{{broken, false, 0}, {refused, false, 0}, {broken, false, minReadPause},
			{refused, false, 0}, {broken, false, 2 * minReadPause}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r readErrors
			for i, s := range tt.steps {
				if got := r.pause(s.err, s.read); got != s.want {
					t.Fatalf("step %d (%v, read %v): pause %v, want %v", i, s.err, s.read, got, s.want)
				}
			}
		})
	}
}
