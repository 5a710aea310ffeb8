package batchio

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A packet sent and read while the process is otherwise idle, as on a
// lightly loaded server, puts to sleep only the threads that had to wait:
// the calls themselves, which never wait (the sockets are non-blocking),
// do not pass through the scheduler's system-call path. That path wakes the
// runtime's monitor thread whenever it had gone to sleep because nothing
// ran, and the monitor then sleeps again: at 1,000 queries/s, 4 of the 6.5
// context switches each query cost the proxy, and 40% of its CPU time.
func TestLonePacketsWakeNoMonitor(t *testing.T) {
	if addr := os.Getenv(loneSenderEnv); addr != "" {
		sendLonePackets(addr)
		return
	}
	from, to := listen(t, "udp4", "127.0.0.1:0"), listen(t, "udp4", "127.0.0.1:0")
	w, err := NewWriter(from)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(to, MaxBatch, 1500)
	if err != nil {
		t.Fatal(err)
	}
	to.SetReadDeadline(time.Now().Add(20 * time.Second))
	// The packets come from another process, one every 2 ms, as queries
	// come to a quiet server: between them nothing in this process runs
	// and no timer of its own is due (a timer would wake the monitor by
	// itself). Each is answered from the other socket, as the proxy sends
	// on after it reads.
	sender := exec.Command(os.Args[0], "-test.run=^TestLonePacketsWakeNoMonitor$")
	sender.Env = append(os.Environ(), loneSenderEnv+"="+to.LocalAddr().String())
	if err := sender.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sender.Process.Kill(); sender.Wait() })
	if _, err := r.Read(); err != nil { // the first, before counting
		t.Fatal(err)
	}
	before := sleeps(t)
	// Counted until the last packet, or until the sender's end mark: on a
	// loaded machine a stalled reader lets the socket's buffer overflow,
	// and the packets lost then never come.
	got := 0
	for ended := false; got < lonePackets-1 && !ended; {
		n, err := r.Read()
		if err != nil {
			t.Fatalf("after %d packets: %v", got, err)
		}
		for i := range n {
			if string(r.Packet(i)) == loneEnd {
				ended = true
			} else {
				got++
			}
		}
		if err := w.Send(r.Addr(0), r.Packet(0)); err != nil {
			t.Fatal(err)
		}
	}
	if got < lonePackets/2 {
		t.Fatalf("only %d of %d packets arrived: too few to count by", got, lonePackets-1)
	}
	per := float64(sleeps(t)-before) / float64(got)
	t.Logf("%.2f threads put to sleep per packet", per)
	// One sleep a packet is the thread that waits in the poller for the
	// next; the monitor woken by the calls added two to three more.
	if per >= 1.75 {
		t.Errorf("%.2f threads put to sleep per lone packet read and answered, want < 1.75: the calls wake the runtime's monitor", per)
	}
}

// The sender's side of TestLonePacketsWakeNoMonitor, run in a process of
// its own: lonePackets packets to the address in loneSenderEnv, 2 ms apart,
// then the end mark every 50 ms (it may be lost too), for at most 20 s.
const (
	loneSenderEnv = "BATCHIO_LONE_SENDER"
	lonePackets   = 300
	loneEnd       = "end"
)

func sendLonePackets(addr string) {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		os.Exit(1)
	}
	for range lonePackets {
		time.Sleep(2 * time.Millisecond) // the pace of the load, in the other process
		c.Write([]byte("lone"))
	}
	for range 400 {
		time.Sleep(50 * time.Millisecond)
		c.Write([]byte(loneEnd))
	}
	os.Exit(0)
}

// sleeps returns how many times the threads of this process have given up
// the CPU of their own accord (each time a thread waits).
func sleeps(t *testing.T) int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		t.Skipf("no /proc/self/task: %v", err)
	}
	n := 0
	for _, status := range tasks {
		b, err := os.ReadFile(status)
		if err != nil {
			continue // the thread has exited
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("voluntary_ctxt_switches:")); ok {
				k, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
				n += k
			}
		}
	}
	return n
}
