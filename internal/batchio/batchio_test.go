package batchio

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

func listen(t testing.TB, network, addr string) *net.UDPConn {
	t.Helper()
	ua, _ := net.ResolveUDPAddr(network, addr)
	c, err := net.ListenUDP(network, ua)
	if err != nil {
		t.Skipf("%s on %s: %v", network, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Everything a Writer is given arrives, in order, at the address given, and
// a Reader reads it back with the sender's address.
func TestWriterToReader(t *testing.T) {
	for _, tt := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6", "[::1]:0"}} {
		t.Run(tt.network, func(t *testing.T) {
			from, to := listen(t, tt.network, tt.addr), listen(t, tt.network, tt.addr)
			to.SetReadBuffer(1 << 20)
			w, err := NewWriter(from)
			if err != nil {
				t.Fatal(err)
			}
			dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
			const n = 300
			for i := range n {
				if err := w.Send(dst, []byte(fmt.Sprintf("packet %d", i))); err != nil {
					t.Fatal(err)
				}
			}
			r, err := NewReader(to, MaxBatch, 1500)
			if err != nil {
				t.Fatal(err)
			}
			to.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, batches := 0, 0
			src := from.LocalAddr().(*net.UDPAddr).AddrPort()
			for got < n {
				k, err := r.Read()
				if err != nil {
					t.Fatalf("after %d packets: %v", got, err)
				}
				batches++
				for i := range k {
					if want := fmt.Sprintf("packet %d", got); string(r.Packet(i)) != want {
						t.Fatalf("packet %q, want %q", r.Packet(i), want)
					}
					if r.Addr(i) != src {
						t.Fatalf("sender %v, want %v", r.Addr(i), src)
					}
					got++
				}
			}
			w.Close()
			t.Logf("%d packets in %d reads", n, batches)
			if err := w.Send(dst, []byte("late")); err != net.ErrClosed {
				t.Errorf("Send after Close = %v, want net.ErrClosed", err)
			}
		})
	}
}

func TestConnectedWriter(t *testing.T) {
	to := listen(t, "udp4", "127.0.0.1:0")
	c, err := net.DialUDP("udp", nil, to.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, _ := NewWriter(c)
	defer w.Close()
	w.Send(netip.AddrPort{}, []byte("hello"))
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, err := to.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

func TestReaderDeadline(t *testing.T) {
	c := listen(t, "udp4", "127.0.0.1:0")
	r, _ := NewReader(c, 4, 512)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.Read(); err == nil {
		t.Fatal("Read on an idle socket past its deadline returned no error")
	}
}

// A held Writer sends nothing until Release: the packets queued while it
// was held go out together, in one system call where sendmmsg exists, made
// by Release itself (no goroutine to wake), and arrive in order.
func TestHeldWriterSendsOneBatch(t *testing.T) {
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	const n = MaxBatch
	w.Hold()
	for i := range n {
		if err := w.Send(dst, []byte(fmt.Sprintf("packet %d", i))); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched() // a woken sender would run now
	}
	w.Release()
	if got := w.calls.Load(); runtime.GOOS == "linux" && got != 1 {
		t.Errorf("Release returned after %d system calls, want 1: the batch sent by Release itself", got)
	}
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for i := range n {
		k, err := to.Read(buf)
		if err != nil {
			t.Fatalf("after %d packets: %v", i, err)
		}
		if want := fmt.Sprintf("packet %d", i); string(buf[:k]) != want {
			t.Fatalf("packet %q, want %q", buf[:k], want)
		}
	}
	want := int64(1)
	if runtime.GOOS != "linux" {
		want = n // one datagram a call
	}
	if got := w.calls.Load(); got != want {
		t.Errorf("%d packets queued while held went out in %d system calls, want %d", n, got, want)
	}
}

// A packet sent to an idle Writer goes out on the caller's goroutine before
// Send returns: a lone answer waits for no goroutine to be woken and
// scheduled. With one P, a woken sender could not have run yet.
func TestLoneSendGoesOutAtOnce(t *testing.T) {
	if !sendsInline {
		t.Skip("this system sends from the Writer's goroutine")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	for i := range 3 {
		if err := w.Send(dst, []byte(fmt.Sprintf("packet %d", i))); err != nil {
			t.Fatal(err)
		}
		if got := w.calls.Load(); got != int64(i+1) {
			t.Fatalf("after Send %d: %d system calls made, want %d: the packet waits for the Writer's goroutine", i, got, i+1)
		}
	}
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for i := range 3 {
		k, err := to.Read(buf)
		if err != nil {
			t.Fatalf("after %d packets: %v", i, err)
		}
		if want := fmt.Sprintf("packet %d", i); string(buf[:k]) != want {
			t.Fatalf("packet %q, want %q", buf[:k], want)
		}
	}
}

// An empty packet, alone or last in its batch, goes out as an empty
// datagram and the packets around it arrive: its payload has no byte to
// point at.
func TestEmptyPacket(t *testing.T) {
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	dst := to.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, p := range []string{"", "one", ""} {
		if err := w.Send(dst, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	w.Hold()
	w.Queue(dst, []byte("two"))
	w.Queue(dst, nil) // last in a batch of two
	w.Release()
	r, err := NewReader(to, MaxBatch, 1500)
	if err != nil {
		t.Fatal(err)
	}
	to.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []string
	for len(got) < 5 {
		k, err := r.Read()
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		for i := range k {
			got = append(got, string(r.Packet(i)))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]string{"", "one", "", "two", ""}) {
		t.Fatalf("got %q", got)
	}
}
