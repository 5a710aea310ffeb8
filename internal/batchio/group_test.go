package batchio

import (
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"
)

// Held through its group, every Writer keeps what it is given until the
// Release, then sends it in one system call; a Writer removed from the
// group is no longer held.
func TestGroupHoldsItsWriters(t *testing.T) {
	if !sendsInline {
		t.Skip("this system sends from the Writer's goroutine")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // a woken sender could not run before the checks
	to := listen(t, "udp4", "127.0.0.1:0")
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	var g Group
	ws := make([]*Writer, 3)
	for i := range ws {
		w, err := NewWriter(listen(t, "udp4", "127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		ws[i] = w
		g.Add(w)
	}
	g.Remove(ws[2])
	held := g.Hold()
	if len(held) != 2 {
		t.Fatalf("Hold held %d writers, want 2", len(held))
	}
	for i, w := range ws {
		for k := range 4 {
			if err := w.Send(dst, []byte(fmt.Sprintf("w%d p%d", i, k))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if c := ws[2].calls.Load(); c != 4 {
		t.Errorf("the writer taken out of the group made %d system calls for 4 packets, want 4 (sent at once)", c)
	}
	for i, w := range ws[:2] {
		if c := w.calls.Load(); c != 0 {
			t.Fatalf("writer %d sent while its group was held (%d system calls)", i, c)
		}
	}
	Release(held)
	for i, w := range ws[:2] {
		if c := w.calls.Load(); c != 1 {
			t.Errorf("writer %d: %d system calls after Release, want 1 for its 4 packets", i, c)
		}
	}
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for i := range 12 {
		if _, err := to.Read(buf); err != nil {
			t.Fatalf("after %d of 12 packets: %v", i, err)
		}
	}
	var nilGroup *Group
	Release(nilGroup.Hold()) // holds nothing, and does not panic
}

// Holders that overlap never keep a packet beyond the first Release that
// follows it: a reader that releases does not wait for the others.
func TestReleaseSendsWhileOthersHold(t *testing.T) {
	if !sendsInline {
		t.Skip("this system sends from the Writer's goroutine")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	to := listen(t, "udp4", "127.0.0.1:0")
	w, err := NewWriter(listen(t, "udp4", "127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Hold() // one holder
	w.Hold() // another, whose batch overlaps
	w.Send(to.LocalAddr().(*net.UDPAddr).AddrPort(), []byte("answer"))
	w.Release()
	if c := w.calls.Load(); c != 1 {
		t.Fatalf("%d system calls after the first Release, want 1: the answer waits for the other holder", c)
	}
	w.Release()
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	if n, err := to.Read(buf); err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}
