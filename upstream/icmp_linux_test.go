package upstream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// icmpSource makes the kernel queue ICMP errors on the upstream's socket
// at srcPort, one a call.
type icmpSource interface {
	send() error
}

// refusal is an upstream that refuses: its socket is connected to a port
// no one sends from, so the kernel finds no socket for a query and answers
// it with ICMP port unreachable, which the querying socket (connected)
// reads as ECONNREFUSED. Its port stays bound. It needs no privilege, but
// the errors come only in answer to the socket's own queries, and a query
// sent while an error waits takes it (the send fails instead).
type refusal struct {
	u    *Upstream
	conn *net.UDPConn
	b    []byte
}

func (r refusal) send() error {
	r.u.Forward(r.b, "udp", func([]byte, []byte, error) {})
	return nil
}

// forgery sends ICMP port unreachable for a packet from srcPort to the
// upstream at dst, as an off-path attacker who knows the port could, on a
// raw socket: it needs CAP_NET_RAW.
type forgery struct {
	fd  int
	pkt []byte
}

func newForgery(t *testing.T, srcPort int, dst *net.UDPAddr) (*forgery, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { unix.Close(fd) })
	pkt := make([]byte, 8+20+8)
	pkt[0], pkt[1] = 3, 3 // destination unreachable, port unreachable
	ip := pkt[8:28]       // the header of the packet "refused": from the socket to the upstream
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], 20+8+12)
	copy(ip[12:16], net.IPv4(127, 0, 0, 1).To4())
	copy(ip[16:20], dst.IP.To4())
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := pkt[28:]
	binary.BigEndian.PutUint16(udp[0:], uint16(srcPort))
	binary.BigEndian.PutUint16(udp[2:], uint16(dst.Port))
	binary.BigEndian.PutUint16(udp[4:], 8+12)
	binary.BigEndian.PutUint16(pkt[2:], checksum(pkt))
	return &forgery{fd: fd, pkt: pkt}, nil
}

func (f *forgery) send() error {
	return unix.Sendto(f.fd, f.pkt, 0, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
}

// checksum is the Internet checksum of b (RFC 1071).
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// refuseAll connects conn to a port no one sends from: the kernel refuses
// every packet sent to it from then on, with ICMP port unreachable.
func refuseAll(t *testing.T, conn *net.UDPConn) {
	t.Helper()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cerr error
	err = rc.Control(func(fd uintptr) {
		cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Port: 1, Addr: [4]byte{127, 0, 0, 1}})
	})
	if err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
}

// Read errors on an upstream socket come from the ICMP errors the kernel
// queues on it (port or host unreachable), one a read: each must cost the
// reader one read, not a pause. Here the upstream holds the replies to a
// few queries while ICMP errors stream in, and sends each in the middle of
// a stream of its own: each must reach its query while its stream still
// runs. Before the fix the reader slept 1 ms after every read error, and
// the kernel reports a queued error before any packet, so errors coming
// faster than one a millisecond — forged by anyone who knows the socket's
// port, or an upstream refusing more than 1,000 packets a second — kept
// every reply on the socket from being read for as long as they came.
func TestAttackICMPErrorsDoNotHoldUpReplies(t *testing.T) {
	const (
		rounds     = 10               // held replies, each sent during a stream of its own
		stream     = 20000            // ICMP errors caused a round at most
		replyAfter = 50               // the held reply is sent after this many
		streamTime = 3 * time.Second  // and a stream stops after this long at most
		wait       = 5 * time.Second  // for a reply, after its stream
		timeout    = 20 * time.Second // no query times out during the test
	)
	for _, source := range []string{"forged", "refused"} {
		t.Run(source, func(t *testing.T) {
			conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			upAddr := conn.LocalAddr().(*net.UDPAddr)
			u := newUpstream(t, Config{Addr: upAddr.String(), UDPSockets: 1, Timeout: timeout})

			var answered [rounds]chan error
			var replies [rounds][]byte
			var from *net.UDPAddr
			for i := range rounds {
				answered[i] = make(chan error, 1)
				u.Forward(mustPack(t, fmt.Sprintf("held%d.example.", i)), "udp", func(_, _ []byte, err error) { answered[i] <- err })
			}
			for range rounds {
				conn.SetReadDeadline(time.Now().Add(wait))
				buf := make([]byte, 512)
				n, addr, err := conn.ReadFromUDP(buf)
				if err != nil {
					t.Fatalf("the upstream got no query: %v", err)
				}
				from = addr
				var i int
				if _, err := fmt.Sscanf(strings.ToLower(nameOf(buf[:n])), "held%d.example.", &i); err != nil || i >= rounds {
					t.Fatalf("unexpected query for %q", nameOf(buf[:n]))
				}
				replies[i] = buf[:n]  // the question echoed exactly, as 0x20 requires
				replies[i][2] |= 0x80 // QR
			}

			var src icmpSource
			switch source {
			case "forged":
				f, err := newForgery(t, from.Port, upAddr)
				if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
					t.Skipf("forging ICMP needs a raw socket (CAP_NET_RAW, e.g. root): %v", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				src = f
			case "refused":
				refuseAll(t, conn)
				src = refusal{u: u, conn: conn, b: mustPack(t, "refused.example.")}
			}

			for r := range rounds {
				start := time.Now()
				sent, readAt := 0, -1
				for sent < stream && time.Since(start) < streamTime && readAt < 0 {
					if err := src.send(); err != nil {
						t.Fatal(err)
					}
					sent++
					if sent == replyAfter {
						if _, err := conn.WriteToUDP(replies[r], from); err != nil { // sendto: a refusing socket's connection does not apply
							t.Fatal(err)
						}
					}
					select {
					case err := <-answered[r]:
						if err != nil {
							t.Fatalf("held query %d ended with %v, want its reply", r, err)
						}
						readAt = sent
					default:
					}
				}
				streamed := time.Since(start)
				if readAt >= 0 {
					t.Logf("round %d: reply sent after %d errors caused, read after %d", r, replyAfter, readAt)
					continue
				}
				select {
				case err := <-answered[r]:
					t.Fatalf("round %d: the reply, sent after %d errors caused, was read only after the stream of %d (%v) ended (err %v): "+
						"the reader paused after each error", r, replyAfter, sent, streamed.Round(time.Millisecond), err)
				case <-time.After(wait):
					t.Fatalf("round %d: the reply was never read: %d errors caused over %v, then %v", r, sent, streamed.Round(time.Millisecond), wait)
				}
			}
		})
	}
}

// nameOf returns the question's name of a query, in presentation format.
func nameOf(query []byte) string {
	m := new(dns.Msg)
	if m.Unpack(query) != nil || len(m.Question) != 1 {
		return ""
	}
	return m.Question[0].Name
}

func mustPack(t *testing.T, name string) []byte {
	t.Helper()
	b, err := q(name).Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
