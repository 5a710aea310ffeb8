package batchio

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An ICMP error queued on a connected socket (here a port unreachable:
// the peer's port was closed when an earlier packet reached it) is
// reported by the socket's next send, which then sends nothing. That
// packet is not the one the error is about: it is sent again, once, and
// reaches the peer now listening. Before, it was dropped, so each ICMP
// error an upstream socket received, forged or not, cost the next query
// sent on it its whole timeout.
func TestQueuedICMPErrorDoesNotDropTheNextPacket(t *testing.T) {
	for _, tt := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6", "[::1]:0"}} {
		t.Run(tt.network, func(t *testing.T) {
			// A free port, then nothing listening on it.
			probe := listen(t, tt.network, tt.addr)
			peer := probe.LocalAddr().(*net.UDPAddr)
			probe.Close()
			c, err := net.DialUDP(tt.network, nil, peer)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("to nobody")); err != nil {
				t.Fatal(err)
			}
			waitSocketError(t, c)
			// The peer now listens, and the error is still queued.
			to, err := net.ListenUDP(tt.network, peer)
			if err != nil {
				t.Skipf("the port was taken meanwhile: %v", err)
			}
			defer to.Close()
			w, err := NewWriter(c)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := w.Send(netip.AddrPort{}, []byte("query")); err != nil {
				t.Fatal(err)
			}
			to.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 100)
			n, err := to.Read(buf)
			if err != nil || string(buf[:n]) != "query" {
				t.Fatalf("the packet sent after an ICMP error was queued: read %q, %v; want it delivered", buf[:n], err)
			}
		})
	}
}

// waitSocketError waits until c has an error queued (POLLERR), at most 2 s.
func waitSocketError(t *testing.T, c *net.UDPConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		var revents int16
		rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLERR}}
			if _, err := unix.Poll(fds, 10); err == nil {
				revents = fds[0].Revents
			}
		})
		if revents&unix.POLLERR != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no ICMP error queued on the socket within 2 s")
		}
	}
}

// A packet the kernel refuses for itself (here one over UDP's largest
// datagram: EMSGSIZE) is tried twice and dropped; the packets after it in
// the same batch still go out, and nothing loops on it.
func TestPacketRefusedForItselfIsDroppedAndTheRestGoOut(t *testing.T) {
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	w.Hold() // the three go out in one batch: the refused one first
	for _, p := range [][]byte{make([]byte, 70000), []byte("after 1"), []byte("after 2")} {
		if err := w.Send(dst, p); err != nil {
			t.Fatal(err)
		}
	}
	w.Release()
	to.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	for _, want := range []string{"after 1", "after 2"} {
		n, err := to.Read(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("read %q, %v; want %q", buf[:n], err, want)
		}
	}
}
