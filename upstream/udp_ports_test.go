package upstream

import (
	"net"
	"testing"
)

// A port to avoid is never bound, even when it is every port there is.
func TestAvoidPortsAreNeverBound(t *testing.T) {
	raddr := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
	var every []uint16
	for p := minPort; p <= 65535; p++ {
		every = append(every, uint16(p))
	}
	if conn, err := listenRandomPort(raddr, every); err == nil {
		conn.Close()
		t.Fatalf("bound port %d, which was to be avoided", conn.LocalAddr().(*net.UDPAddr).Port)
	}
	conn, err := listenRandomPort(raddr, every[:len(every)/4])
	if err != nil {
		t.Fatalf("three quarters of the range left: %v", err)
	}
	defer conn.Close()
	if p := conn.LocalAddr().(*net.UDPAddr).Port; p < minPort+len(every)/4 {
		t.Fatalf("bound port %d, in the quarter to be avoided", p)
	}
}
