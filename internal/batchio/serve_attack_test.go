//go:build linux

package batchio

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stallAfter is how long a packet may wait to be served before the test
// calls it stalled: nothing else arrives meanwhile, so a packet Serve
// left queued is never served.
const stallAfter = 3 * time.Second

// listenDualStack binds an IPv6 socket that also takes IPv4, on the
// IPv4-mapped loopback address: a dual-stack listener that hears only
// 127.0.0.1.
func listenDualStack(t *testing.T) *net.UDPConn {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("IPv6 socket: %v", err)
	}
	sa := &unix.SockaddrInet6{Addr: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		unix.Close(fd)
		t.Skipf("dual-stack socket: %v", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		t.Skipf("dual-stack socket on ::ffff:127.0.0.1: %v", err)
	}
	f := os.NewFile(uintptr(fd), "dual-stack")
	pc, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.(*net.UDPConn)
}

// seqPacket is a datagram carrying its sequence number.
func seqPacket(i int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(i)) }

// spin keeps the goroutine busy for about d without yielding: a handler
// at work.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

// A packet that comes in while a batch is being served, after the read
// that brought the batch found the socket empty, is served without
// another packet coming to announce it: the sharpest case of Serve's
// claim (it waits at once after a short batch). Each round's packets are
// sent by the handler of the last packet of the round before (on loopback
// a send queues the packet on the receiver, and signals it, before it
// returns), or by another goroutine as the handler returns, racing the
// wait. Rounds are 1 packet, or around a batch's size, so that batches end
// short, exactly full, and full with a remainder. Each packet must be
// served exactly once; a packet not served within stallAfter stalled.
func TestServeAttackPacketDuringHandler(t *testing.T) {
	for _, tt := range []struct {
		name   string
		listen func(t *testing.T) *net.UDPConn
		from   func(t *testing.T) *net.UDPConn
		batch  int
		procs  int // GOMAXPROCS during the test, 0: as is
	}{
		{"udp4", func(t *testing.T) *net.UDPConn { return listen(t, "udp4", "127.0.0.1:0") }, nil, MaxBatch, 0},
		{"udp6", func(t *testing.T) *net.UDPConn { return listen(t, "udp6", "[::1]:0") }, nil, MaxBatch, 0},
		{"dual-stack, IPv4 client", listenDualStack, func(t *testing.T) *net.UDPConn { return listen(t, "udp4", "127.0.0.1:0") }, MaxBatch, 0},
		{"batch of 2", func(t *testing.T) *net.UDPConn { return listen(t, "udp4", "127.0.0.1:0") }, nil, 2, 0},
		{"batch of 1", func(t *testing.T) *net.UDPConn { return listen(t, "udp4", "127.0.0.1:0") }, nil, 1, 0},
		{"GOMAXPROCS 1", func(t *testing.T) *net.UDPConn { return listen(t, "udp4", "127.0.0.1:0") }, nil, MaxBatch, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.procs > 0 {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tt.procs))
			}
			conn := tt.listen(t)
			conn.SetReadBuffer(1 << 20)
			var from *net.UDPConn
			if tt.from != nil {
				from = tt.from(t)
			} else {
				la := conn.LocalAddr().(*net.UDPAddr)
				from = listen(t, la.Network(), net.JoinHostPort(la.IP.String(), "0"))
			}
			to := conn.LocalAddr().(*net.UDPAddr)
			if tt.from != nil { // the dual-stack socket, reached over IPv4
				to = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: to.Port}
			}
			r, err := NewReader(conn, tt.batch, 64)
			if err != nil {
				t.Fatal(err)
			}
			const total = 4000
			rng := rand.New(rand.NewPCG(uint64(tt.batch), uint64(tt.procs)+7))
			sizes := []int{1, 1, 1, tt.batch - 1, tt.batch, tt.batch + 1, 2 * tt.batch, 2*tt.batch + 1}
			seen := make([]bool, total)
			var served atomic.Int64
			roundEnd := 0 // the last sequence number of the round in flight
			sendErr := make(chan error, 1)
			// plan picks the next round's size, on the handler's goroutine
			// (or before Serve starts); sendRound sends it, on either.
			plan := func(first int) int {
				n := min(max(sizes[rng.IntN(len(sizes))], 1), total-first)
				roundEnd = first + n - 1
				return n
			}
			sendRound := func(first, n int) {
				for i := first; i < first+n; i++ {
					if _, err := from.WriteToUDP(seqPacket(i), to); err != nil {
						select {
						case sendErr <- err:
						default:
						}
						return
					}
				}
			}
			elsewhere := make(chan [2]int, 1) // a round another goroutine sends
			senderDone := make(chan struct{})
			go func() {
				defer close(senderDone)
				for round := range elsewhere {
					sendRound(round[0], round[1])
				}
			}()
			bad := make(chan string, 1)
			fail := func(s string) {
				select {
				case bad <- s:
				default:
				}
			}
			firstRound := plan(0)
			done := make(chan error, 1)
			go func() {
				done <- r.Serve(func(n int) {
					for i := range n {
						p := r.Packet(i)
						if len(p) != 4 {
							fail("a packet of the wrong size")
							return
						}
						seq := int(binary.BigEndian.Uint32(p))
						if seq >= total || seen[seq] {
							fail("a packet served twice, or never sent")
							return
						}
						seen[seq] = true
						served.Add(1)
						if seq != roundEnd || seq == total-1 {
							continue
						}
						// The round's last packet: the next round comes in now,
						// while this batch is being served, or as it ends.
						next := plan(seq + 1)
						switch rng.IntN(3) {
						case 0:
							sendRound(seq+1, next)
						case 1:
							sendRound(seq+1, next)
							spin(time.Duration(rng.IntN(30)) * time.Microsecond)
						case 2:
							elsewhere <- [2]int{seq + 1, next}
						}
					}
				})
			}()
			defer func() {
				conn.Close()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Error("Serve still running 5 s after Close")
				}
				close(elsewhere)
				<-senderDone
			}()
			before := r.sys.reads.Load()
			defer func() { t.Logf("%.2f reads a packet", float64(r.sys.reads.Load()-before)/total) }()
			sendRound(0, firstRound)
			last, lastMove := int64(0), time.Now()
			for served.Load() < total {
				select {
				case s := <-bad:
					t.Fatal(s)
				case err := <-sendErr:
					t.Fatal(err)
				case err := <-done:
					t.Fatalf("Serve ended after %d packets: %v", served.Load(), err)
				case <-time.After(time.Millisecond):
				}
				if n := served.Load(); n != last {
					last, lastMove = n, time.Now()
				} else if time.Since(lastMove) > stallAfter {
					t.Fatalf("stall: %d of %d packets served, none for %v, the next one queued and unannounced", n, total, stallAfter)
				}
			}
		})
	}
}

// Empty datagrams and datagrams larger than the buffer are served once
// each, marked as they should be, and cost no spinning: two reads a packet
// at most (one, but for a wake-up kept from a packet already read).
func TestServeAttackEmptyAndTruncated(t *testing.T) {
	conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	const bufSize = 16
	r, err := NewReader(conn, MaxBatch, bufSize)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		size int
		cut  bool
	}
	served := make(chan got, 64)
	go r.Serve(func(n int) {
		for i := range n {
			served <- got{len(r.Packet(i)), r.Truncated(i)}
		}
	})
	to := conn.LocalAddr().(*net.UDPAddr)
	sends := []struct {
		size int
		want got
	}{
		{0, got{0, false}},
		{bufSize, got{bufSize, false}},
		{bufSize + 1, got{bufSize, true}},
		{1000, got{bufSize, true}},
		{0, got{0, false}},
		{3, got{3, false}},
	}
	before := r.sys.reads.Load()
	for round := range 20 {
		burst := 1 + round%3 // lone packets, then two or three queued together
		for k := 0; k < len(sends); k += burst {
			end := min(k+burst, len(sends))
			for _, s := range sends[k:end] {
				if _, err := from.WriteToUDP(make([]byte, s.size), to); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range sends[k:end] {
				select {
				case g := <-served:
					if g != s.want {
						t.Fatalf("round %d: a datagram of %d bytes served as %+v, want %+v", round, s.size, g, s.want)
					}
				case <-time.After(stallAfter):
					t.Fatalf("round %d: a datagram of %d bytes not served within %v", round, s.size, stallAfter)
				}
			}
		}
	}
	reads := r.sys.reads.Load() - before
	if max := int64(2 * 20 * len(sends)); reads > max {
		t.Errorf("%d reads for %d datagrams, want at most %d: Serve spins", reads, 20*len(sends), max)
	}
	select {
	case g := <-served:
		t.Errorf("a datagram served twice: %+v", g)
	default:
	}
	conn.Close()
}

// Shutdown wakes the reader with a read deadline in the past. Serve returns
// os.ErrDeadlineExceeded whether it was waiting or serving a short batch
// when the deadline came, and a Serve started again once the deadline is
// lifted serves the packets that came in while none ran (their signal came
// before its first wait: it reads first).
func TestServeAttackDeadlineThenServeAgain(t *testing.T) {
	for _, during := range []string{"waiting", "serving"} {
		t.Run(during, func(t *testing.T) {
			conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
			r, err := NewReader(conn, MaxBatch, 64)
			if err != nil {
				t.Fatal(err)
			}
			to := conn.LocalAddr().(*net.UDPAddr)
			served := make(chan string, 64)
			inHandler := make(chan struct{}, 4)
			goOn := make(chan struct{}, 4)
			handle := func(n int) {
				for i := range n {
					served <- string(r.Packet(i))
				}
				inHandler <- struct{}{}
				<-goOn // the test lets each batch's handler return
			}
			send := func(s string) {
				t.Helper()
				if _, err := from.WriteToUDP([]byte(s), to); err != nil {
					t.Fatal(err)
				}
			}
			expect := func(want string) {
				t.Helper()
				select {
				case got := <-served:
					if got != want {
						t.Fatalf("served %q, want %q", got, want)
					}
				case <-time.After(stallAfter):
					t.Fatalf("%q not served within %v", want, stallAfter)
				}
				select {
				case <-inHandler:
				case <-time.After(stallAfter):
					t.Fatal("the handler did not finish serving")
				}
			}
			ended := func(done <-chan error) {
				t.Helper()
				select {
				case err := <-done:
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("Serve ended with %v, want the deadline", err)
					}
				case <-time.After(stallAfter):
					t.Fatalf("Serve still running %v after the deadline", stallAfter)
				}
			}
			done := make(chan error, 1)
			go func() { done <- r.Serve(handle) }()
			send("first")
			expect("first")
			if during == "serving" {
				goOn <- struct{}{}
				send("second")
				expect("second")
				// The handler of "second", a short batch, is still running:
				// the deadline comes before it returns false to wait.
				conn.SetReadDeadline(time.Now())
				goOn <- struct{}{}
			} else {
				goOn <- struct{}{} // it returns and waits
				conn.SetReadDeadline(time.Now())
			}
			ended(done)
			// Nobody reads now: this packet's signal falls on no wait.
			send("meanwhile")
			conn.SetReadDeadline(time.Time{})
			done = make(chan error, 1)
			go func() { done <- r.Serve(handle) }()
			expect("meanwhile")
			conn.SetReadDeadline(time.Now())
			goOn <- struct{}{}
			ended(done)
		})
	}
}

// Close waits for the batch being served (the handler runs inside the
// socket's read), and no batch is served after it: Serve returns
// net.ErrClosed. A handler that blocks therefore holds up Close, which
// Read's callers never did: the reason Serve's handler must not block.
func TestServeAttackCloseWaitsForHandler(t *testing.T) {
	conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	r, err := NewReader(conn, MaxBatch, 64)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var after atomic.Int64 // batches served after Close returned
	var closedFlag atomic.Bool
	done := make(chan error, 1)
	go func() {
		first := true
		done <- r.Serve(func(n int) {
			if closedFlag.Load() {
				after.Add(1)
			}
			if first {
				first = false
				close(entered)
				<-release
			}
		})
	}()
	to := conn.LocalAddr().(*net.UDPAddr)
	from.WriteToUDP([]byte("x"), to)
	select {
	case <-entered:
	case <-time.After(stallAfter):
		t.Fatal("the packet not served")
	}
	from.WriteToUDP([]byte("queued behind"), to)
	closed := make(chan struct{})
	go func() { conn.Close(); closedFlag.Store(true); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the handler was still serving its batch")
	case <-time.After(50 * time.Millisecond): // a negative check: Close must still be waiting
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(stallAfter):
		t.Fatal("Close still waiting after the handler returned")
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve ended with %v, want net.ErrClosed", err)
		}
	case <-time.After(stallAfter):
		t.Fatal("Serve still running after Close")
	}
	if n := after.Load(); n != 0 {
		t.Errorf("%d batches served after Close returned", n)
	}
}

// A socket that queues ICMP errors (a connected one, as the upstream's are,
// or here, so that packets can keep coming from anywhere, one with
// IP_RECVERR) may have a batch cut short by an error with packets behind
// it: no packet stalls, because the kernel signals the error itself (the
// wait wakes and the next read returns it) and a Serve started again reads
// first. Here every reply the socket sends goes to a closed port, so errors
// keep coming while packets arrive one by one.
func TestServeAttackErrorsQueuedWithRecvErr(t *testing.T) {
	conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1) })
	if serr != nil {
		t.Skipf("IP_RECVERR: %v", serr)
	}
	closedPort := listen(t, "udp4", "127.0.0.1:0")
	dead := closedPort.LocalAddr().(*net.UDPAddr)
	closedPort.Close() // its port now answers port unreachable
	r, err := NewReader(conn, MaxBatch, 64)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan int, 64)
	var errs atomic.Int64
	stop := make(chan struct{})
	loop := make(chan struct{})
	go func() { // as serveUDP: a transient error, serve again
		defer close(loop)
		for {
			err := r.Serve(func(n int) {
				for i := range n {
					served <- int(binary.BigEndian.Uint32(r.Packet(i)))
					conn.WriteToUDP([]byte("reply"), dead) // an ICMP error to come
				}
			})
			if errors.Is(err, net.ErrClosed) {
				return
			}
			errs.Add(1)
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	defer func() { close(stop); conn.Close(); <-loop }()
	to := conn.LocalAddr().(*net.UDPAddr)
	const total = 3000
	for i := range total {
		if _, err := from.WriteToUDP(seqPacket(i), to); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // and errors that come while nothing is read
			conn.WriteToUDP([]byte("reply"), dead)
		}
		select {
		case got := <-served:
			if got != i {
				t.Fatalf("served packet %d, want %d", got, i)
			}
		case <-time.After(stallAfter):
			t.Fatalf("stall: packet %d not served within %v (%d errors so far)", i, stallAfter, errs.Load())
		}
	}
	t.Logf("%d errors returned by Serve over %d packets", errs.Load(), total)
	if errs.Load() == 0 {
		t.Error("no error reached Serve: the attack did not happen")
	}
}
