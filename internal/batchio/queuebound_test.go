package batchio

import (
	"errors"
	"net"
	"testing"
)

// The README's bound: at most MaxQueued packets a socket, "beyond that a
// packet is dropped, as a full socket would". Packets taken out of the
// queue to be sent count until they are done with: a batch the socket
// could not take goes back to the queue, which must not then hold more
// than the bound.
func TestQueueBoundCountsTheBatchBeingSent(t *testing.T) {
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Hold() // nothing sends but the test
	defer w.Release()
	p := []byte("answer")
	for i := range MaxQueued {
		if _, err := w.Queue(dst, p); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
	}
	w.sending.Lock()
	queue, arena, _ := w.take()
	_, err = w.Queue(dst, p)
	w.requeue(queue, arena) // the socket could take none of them now
	w.sending.Unlock()
	if !errors.Is(err, ErrQueueFull) {
		t.Errorf("with %d packets taken out to be sent, Queue took another (err %v)", len(queue), err)
	}
	w.mu.Lock()
	n := len(w.queue)
	w.mu.Unlock()
	if n > MaxQueued {
		t.Errorf("after the batch went back: %d packets queued, bound %d", n, MaxQueued)
	}
}
