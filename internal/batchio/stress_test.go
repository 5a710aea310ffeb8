package batchio

import (
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Senders, Queue+Flush callers and overlapping holders race; once all have
// returned, nothing may stay queued (a lost wake-up leaves it there forever).
func TestNoPacketLeftQueued(t *testing.T) {
	for _, procs := range []int{1, 2} {
		func() {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
			from.SetWriteBuffer(4096) // small: inline sends may find it full and requeue
			dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
			deadline := time.Now().Add(3 * time.Second)
			for round := 0; round < 100 && time.Now().Before(deadline); round++ {
				w, err := NewWriter(from)
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				for g := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range 50 {
							switch (g + i) % 3 {
							case 0:
								w.Hold()
								w.Send(dst, []byte("held"))
								runtime.Gosched()
								w.Release()
							case 1:
								if first, _ := w.Queue(dst, []byte("q")); first {
									runtime.Gosched()
									w.Flush()
								}
							default:
								w.Send(dst, []byte("s"))
							}
						}
					}()
				}
				wg.Wait()
				for stuck := time.Now().Add(3 * time.Second); ; {
					w.mu.Lock()
					n, q := len(w.queue), w.queued.Load()
					w.mu.Unlock()
					if n == 0 && q == 0 {
						break
					}
					if time.Now().After(stuck) {
						t.Fatalf("procs %d round %d: %d packets queued (queued=%d, wake tokens %d) with every sender and holder gone", procs, round, n, q, len(w.wake))
					}
					runtime.Gosched()
				}
				w.Close()
			}
		}()
	}
}

// A Writer closed while held (and with packets queued under the hold) still
// sends them, and a Release after Close neither blocks nor panics.
func TestCloseWhileHeld(t *testing.T) {
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	to.SetReadBuffer(1 << 20)
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	g := new(Group)
	g.Add(w)
	held := g.Hold()
	for range 10 {
		w.Send(dst, []byte("x"))
	}
	g.Remove(w)
	w.Close()
	Release(held)
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	for i := range 10 {
		if _, err := to.Read(buf); err != nil {
			t.Fatalf("after %d of 10: %v", i, err)
		}
	}
}
