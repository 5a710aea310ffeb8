package batchio

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// serveInBackground runs r.Serve, handing each packet's payload to the
// channel it returns, and returns what Serve ended with on done.
func serveInBackground(t *testing.T, r *Reader, slow func()) (got <-chan string, done <-chan error) {
	t.Helper()
	packets := make(chan string, 1<<14)
	ended := make(chan error, 1)
	go func() {
		ended <- r.Serve(func(n int) {
			if slow != nil {
				slow()
			}
			for i := range n {
				packets <- string(r.Packet(i))
			}
		})
	}()
	return packets, ended
}

// lonePacketReads sends packets one at a time from from to conn, each
// loneGap after the last was served, as queries come to a quiet server,
// and returns how many reads the reader made a packet. Within the gap the
// reader is done with the last packet's reads and waiting, unless the
// machine stalls it that long (then a read it would make finds the next
// packet instead: fewer reads, never more).
func lonePacketReads(t *testing.T, conn *net.UDPConn, r *Reader, from *net.UDPConn) float64 {
	t.Helper()
	got, _ := serveInBackground(t, r, nil)
	to := conn.LocalAddr().(*net.UDPAddr)
	const packets = 100
	before := r.sys.reads.Load()
	for i := range packets {
		want := fmt.Sprint("lone ", i)
		if _, err := from.WriteToUDP([]byte(want), to); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-got:
			if p != want {
				t.Fatalf("served %q, want %q", p, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("packet %d not served within 5 s", i)
		}
		time.Sleep(loneGap) // the pace of the load
	}
	return float64(r.sys.reads.Load()-before) / packets
}

// loneGap is the time between lone packets.
const loneGap = 3 * time.Millisecond

// A lone packet costs one read: the read that found it was short, so the
// socket was empty, and Serve waits for the next packet without reading
// again to find nothing (at 5,000 queries/s that was one system call in
// four of every recvmmsg the proxy made), on a socket that is not connected,
// as the proxy's listeners are, and on a connected one, as its upstream
// sockets are.
func TestServeReadsOncePerLonePacket(t *testing.T) {
	t.Run("unconnected", func(t *testing.T) {
		conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
		lonePacketsReadOnce(t, conn, from)
	})
	t.Run("connected", func(t *testing.T) {
		peer := listen(t, "udp4", "127.0.0.1:0")
		conn, err := net.DialUDP("udp4", nil, peer.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		lonePacketsReadOnce(t, conn, peer)
	})
}

func lonePacketsReadOnce(t *testing.T, conn, from *net.UDPConn) {
	t.Helper()
	r, err := NewReader(conn, MaxBatch, 1500)
	if err != nil {
		t.Fatal(err)
	}
	per := lonePacketReads(t, conn, r, from)
	t.Logf("%.2f reads a lone packet", per)
	// A wake-up the poller kept from a packet already read costs a read
	// that finds nothing, now and then; every packet's costs two.
	if per >= 1.5 {
		t.Errorf("%.2f reads a lone packet, want < 1.5: Serve reads again after a short batch", per)
	}
}

// Whatever comes in is served, however it is spread over time: lone
// packets, bursts larger than a batch, packets that arrive while a batch is
// being served (its handler slow), each at random, in one long Serve.
func TestServeLosesNoPacket(t *testing.T) {
	conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	conn.SetReadBuffer(4 << 20)
	r, err := NewReader(conn, MaxBatch, 1500)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var slowNext atomic.Bool
	got, _ := serveInBackground(t, r, func() {
		if slowNext.Swap(false) {
			time.Sleep(200 * time.Microsecond) // the batch's work: packets come in meanwhile
		}
	})
	to := conn.LocalAddr().(*net.UDPAddr)
	sent := 0
	deadline := time.Now().Add(10 * time.Second)
	for round := 0; round < 300 && time.Now().Before(deadline); round++ {
		burst := 1
		switch rng.IntN(4) {
		case 0:
			burst = 1 + rng.IntN(3*MaxBatch) // more than a batch, often
		case 1:
			slowNext.Store(true)
			burst = 1 + rng.IntN(4)
		}
		for range burst {
			if _, err := from.WriteToUDP([]byte(fmt.Sprint(sent)), to); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		if rng.IntN(2) == 0 { // sometimes the next burst waits for this one
			for served := 0; served < burst; served++ {
				select {
				case <-got:
				case <-time.After(5 * time.Second):
					t.Fatalf("round %d: %d of a burst of %d packets not served within 5 s", round, burst-served, burst)
				}
			}
			sent -= burst
		}
	}
	for served := 0; served < sent; served++ {
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of the last %d packets not served within 5 s", sent-served, sent)
		}
	}
}

// Close ends Serve, even while packets keep coming in full batches: a
// Close waits for the read in progress, so Serve must leave it between
// batches.
func TestServeEndsOnCloseUnderFlood(t *testing.T) {
	conn, from := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	conn.SetReadBuffer(4 << 20)
	r, err := NewReader(conn, MaxBatch, 1500)
	if err != nil {
		t.Fatal(err)
	}
	// A slow handler: the flood fills the socket meanwhile, so every read
	// brings a full batch.
	got, done := serveInBackground(t, r, func() { time.Sleep(500 * time.Microsecond) })
	go func() { // drain what is served, so the handler never blocks
		for range got {
		}
	}()
	stop := make(chan struct{})
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		to := conn.LocalAddr().(*net.UDPAddr)
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); {
			select {
			case <-stop:
				return
			default:
			}
			from.WriteToUDP([]byte("flood"), to)
		}
	}()
	defer func() { close(stop); <-flooding }()
	for r.sys.reads.Load() < 20 { // the flood is being served
		select {
		case err := <-done:
			t.Fatalf("Serve ended before Close: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	closed := make(chan struct{})
	go func() { conn.Close(); close(closed) }()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve ended with %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still serving 5 s after Close, under a flood")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waiting 5 s after Serve ended")
	}
}
