package upstream

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// hostilePair listens on UDP and TCP on the same loopback port: udp
// answers each datagram as reply says (any number of raw datagrams), tcp
// hands each accepted connection to conn.
type hostilePair struct {
	udp *net.UDPConn
	tcp *net.TCPListener
	wg  sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func newHostilePair(t *testing.T, reply func(req []byte) [][]byte, conn func(c *net.TCPConn)) *hostilePair {
	t.Helper()
	h := &hostilePair{}
	for attempt := 0; h.tcp == nil; attempt++ { // the port UDP got may be taken for TCP: try another
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: u.LocalAddr().(*net.UDPAddr).Port})
		if err != nil {
			u.Close()
			if attempt == 10 {
				t.Fatal(err)
			}
			continue
		}
		h.udp, h.tcp = u, l
	}
	h.wg.Go(func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := h.udp.ReadFromUDP(buf)
			if err != nil {
				return
			}
			for _, p := range reply(append([]byte(nil), buf[:n]...)) {
				h.udp.WriteToUDP(p, from)
			}
		}
	})
	h.wg.Go(func() {
		for {
			c, err := h.tcp.AcceptTCP()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			h.wg.Go(func() { conn(c) })
		}
	})
	t.Cleanup(func() {
		h.udp.Close()
		h.tcp.Close()
		h.mu.Lock()
		for _, c := range h.conns {
			c.Close()
		}
		h.mu.Unlock()
		h.wg.Wait()
	})
	return h
}

func (h *hostilePair) addr() string { return h.udp.LocalAddr().String() }

// packedAnswer is a valid answer to the raw query req, in req's case.
func packedAnswer(t testing.TB, req []byte) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(req); err != nil {
		return nil
	}
	b, _ := answer(m).Pack()
	return b
}

// readFrame reads one length-prefixed frame from c, within d.
func readFrame(c net.Conn, d time.Duration) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(d))
	var l [2]byte
	if _, err := ioReadFull(c, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := ioReadFull(c, b)
	return b, err
}

func ioReadFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// A hostile TCP upstream, connection by connection as they are opened:
// accepts and never reads; reads and never answers; answers half a frame
// and resets; claims a 65,535-byte frame and closes; sends frames too short
// to be a reply, then a frame for another ID, then the right answer twice.
// Every query is reported exactly once, by its deadline (plus the sweeper's
// pass), and Close returns at once.
func TestHostileTCPUpstreamEachQueryOnce(t *testing.T) {
	var accepted atomic.Int32
	stop := make(chan struct{}) // closed before the pair's own clean-up waits for its handlers
	h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
		switch accepted.Add(1) % 5 {
		case 1: // accepts, never reads
			<-stop
			return
		case 2: // reads, never answers
			for {
				if _, err := readFrame(c, 3*time.Second); err != nil {
					return
				}
			}
		case 3: // half a frame, then a reset
			req, err := readFrame(c, 3*time.Second)
			if err != nil {
				return
			}
			a := packedAnswer(t, req)
			f := binary.BigEndian.AppendUint16(nil, uint16(len(a)))
			f = append(f, a[:len(a)/2]...)
			c.Write(f)
			c.SetLinger(0)
			c.Close()
		case 4: // a frame that never comes whole
			if _, err := readFrame(c, 3*time.Second); err != nil {
				return
			}
			c.Write([]byte{0xff, 0xff, 1, 2, 3})
			c.Close()
		default: // garbage, a wrong ID, then the answer twice
			for {
				req, err := readFrame(c, 3*time.Second)
				if err != nil {
					return
				}
				a := packedAnswer(t, req)
				var out []byte
				out = append(out, 0, 0, 0, 3, 1, 2, 3, 0, 11)
				out = append(out, make([]byte, 11)...)
				wrong := append([]byte(nil), a...)
				wrong[0] ^= 0x55
				for _, f := range [][]byte{wrong, a, a} {
					out = binary.BigEndian.AppendUint16(out, uint16(len(f)))
					out = append(out, f...)
				}
				c.Write(out)
			}
		}
	})
	t.Cleanup(func() { close(stop) }) // after the pair's: clean-ups run last first
	const timeout = 300 * time.Millisecond
	u, err := New(Config{Addr: h.addr(), Timeout: timeout, TCPIdle: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	var reports [n]atomic.Int32
	var lateness [n]atomic.Int64 // past the timeout, when first reported
	var answered atomic.Int32
	var all sync.WaitGroup
	all.Add(n)
	stalls := meterStalls(t)
	start := time.Now()
	for i := range n {
		m := q(fmt.Sprintf("h%d.example.", i))
		m.Id = uint16(i)
		b, _ := m.Pack()
		sent := time.Now()
		u.Forward(b, "tcp", func(query, reply []byte, err error) {
			if reports[i].Add(1) == 1 {
				lateness[i].Store(int64(time.Since(sent) - timeout))
				all.Done()
			}
			if err == nil {
				answered.Add(1)
				if binary.BigEndian.Uint16(reply) != uint16(i) {
					t.Errorf("query %d got a reply with ID %d", i, binary.BigEndian.Uint16(reply))
				}
			}
		})
		if i%20 == 19 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitGroup(t, &all, 5*time.Second, "every query reported")
	// Reported by the deadline: within 200 ms of it, beyond what the whole
	// process stalled meanwhile.
	stalled := stalls()
	late := 0
	for i := range lateness {
		if time.Duration(lateness[i].Load()) > 200*time.Millisecond+stalled {
			late++
		}
	}
	closed := make(chan struct{})
	go func() { u.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("Close took more than 2s")
	}
	for i := range reports {
		if got := reports[i].Load(); got != 1 {
			t.Errorf("query %d reported %d times", i, got)
		}
	}
	t.Logf("%d answered, %d later than the deadline by 200ms and the %v the process stalled, %v, %d connections",
		answered.Load(), late, stalled, time.Since(start), accepted.Load())
	if late > 0 {
		t.Errorf("%d queries reported more than 200ms past their deadline (and past the %v the process stalled)", late, stalled)
	}
	if accepted.Load() < 5 {
		t.Errorf("%d connections: not every behaviour met a query", accepted.Load())
	}
}

// A hostile UDP upstream answers every query with, in one burst: a reply
// shorter than a header, the question with QR clear, one with two
// questions, the question with records counted but absent, a TC reply with
// no records, the answer cut in the middle of a record, and a datagram too
// large to read whole (fetched over TCP, where the connection resets). No
// panic, each query reported exactly once, and never with a reply whose ID
// or question is not its own.
func TestHostileUDPRepliesEachQueryOnce(t *testing.T) {
	h := newHostilePair(t, func(req []byte) [][]byte {
		a := packedAnswer(t, req)
		if a == nil {
			return nil
		}
		qend, _ := wireQuestionEnd(req)
		noQR := append([]byte(nil), a...)
		noQR[2] &^= 0x80
		twoQ := append([]byte(nil), a[:qend]...)
		twoQ[5] = 2
		twoQ = append(twoQ, a[12:qend]...)
		counted := append([]byte(nil), a[:qend]...)
		counted[7], counted[9], counted[11] = 0xff, 0xff, 0xff
		tc := append([]byte(nil), a[:qend]...)
		tc[2] |= 0x02
		tc[7] = 0
		cut := a[:len(a)-3]
		big := append([]byte(nil), a...)
		big = append(big, make([]byte, 9000)...)
		id := binary.BigEndian.Uint16(req)
		switch id % 4 {
		case 0:
			return [][]byte{a[:5], noQR, twoQ, counted}
		case 1:
			return [][]byte{tc}
		case 2:
			return [][]byte{cut}
		}
		return [][]byte{big}
	}, func(c *net.TCPConn) {
		if _, err := readFrame(c, 3*time.Second); err != nil {
			return
		}
		c.Write([]byte{0, 40, 1, 2})
		c.SetLinger(0)
		c.Close()
	})
	const timeout = 300 * time.Millisecond
	u, err := New(Config{Addr: h.addr(), Timeout: timeout, UDPSockets: 2, SocketQueries: 13})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	var reports [n]atomic.Int32
	var all sync.WaitGroup
	all.Add(n)
	var errs sync.Map
	for i := range n {
		m := q(fmt.Sprintf("U%d.Example.", i))
		m.Id = uint16(i)
		b, _ := m.Pack()
		want := string(b[12:])
		u.Forward(b, "udp", func(query, reply []byte, err error) {
			if reports[i].Add(1) == 1 {
				all.Done()
			}
			if err != nil {
				errs.Store(err.Error(), true)
				return
			}
			if binary.BigEndian.Uint16(reply) != uint16(i) || len(reply) < len(want) || string(reply[12:12+len(b)-12]) != want {
				t.Errorf("query %d got %x", i, reply)
			}
		})
	}
	waitGroup(t, &all, 5*time.Second, "every query reported")
	u.Close()
	for i := range reports {
		if got := reports[i].Load(); got != 1 {
			t.Errorf("query %d reported %d times", i, got)
		}
	}
	errs.Range(func(k, _ any) bool { t.Logf("error seen: %v", k); return true })
}

func wireQuestionEnd(p []byte) (int, bool) {
	i := 12
	for i < len(p) && p[i] != 0 {
		i += int(p[i]) + 1
	}
	if i+5 > len(p) {
		return 0, false
	}
	return i + 5, true
}
