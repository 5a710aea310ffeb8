// Package batchio moves UDP datagrams in batches: on Linux one recvmmsg or
// sendmmsg system call carries up to MaxBatch packets, elsewhere one call
// carries one. A Reader belongs to one goroutine; a Writer takes packets from
// any number of goroutines: one that finds it idle goes out at once on the
// sender's goroutine, and those queued while someone was sending go out
// together, from the Writer's own goroutine or a reader releasing its Hold.
package batchio

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// MaxBatch is the most packets one system call moves.
const MaxBatch = 32

// MaxQueued bounds a Writer's queue; beyond it Send drops the packet.
const MaxQueued = 8192

// ErrQueueFull is returned by Send when the queue is at MaxQueued.
var ErrQueueFull = errors.New("batchio: send queue full")

// Reader reads datagrams from one socket, up to MaxBatch per call.
type Reader struct {
	conn  *net.UDPConn
	bufs  [][]byte
	sizes []int
	cut   []bool // the datagram was larger than its buffer
	addrs []netip.AddrPort
	sys   readerSys // the platform's part
}

// NewReader returns a Reader with batch buffers of bufSize bytes each.
func NewReader(conn *net.UDPConn, batch, bufSize int) (*Reader, error) {
	batch = min(max(batch, 1), MaxBatch)
	r := &Reader{conn: conn, bufs: make([][]byte, batch), sizes: make([]int, batch), cut: make([]bool, batch),
		addrs: make([]netip.AddrPort, batch)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, bufSize)
	}
	return r, r.sys.init(r)
}

// Read waits for at least one datagram and returns how many it read.
// Packet and Addr give them until the next Read.
func (r *Reader) Read() (int, error) { return r.sys.read(r) }

// Serve reads batches until the socket is closed or fails, handing each to
// handle, which reads it through Packet, Truncated and Addr and must not
// block (the socket's Close waits for it to return). It returns the error
// that ended it. On Linux it reads no more often than it must: after a
// batch that emptied the socket it waits for the next packet without first
// reading to find nothing, as Read's caller must.
func (r *Reader) Serve(handle func(n int)) error { return r.sys.serve(r, handle) }

// Packet returns the i-th datagram of the last Read.
func (r *Reader) Packet(i int) []byte { return r.bufs[i][:r.sizes[i]] }

// Truncated reports whether the i-th datagram was larger than the buffer,
// so that Packet holds only its beginning.
func (r *Reader) Truncated(i int) bool { return r.cut[i] }

// Addr returns the sender of the i-th datagram of the last Read.
func (r *Reader) Addr(i int) netip.AddrPort { return r.addrs[i] }

// Writer sends datagrams on one socket: on the sender's goroutine when it
// is idle, else from a goroutine of its own or a reader's releasing a Hold.
type Writer struct {
	conn *net.UDPConn
	wake chan struct{} // a token: there is something to send

	mu      sync.Mutex
	queue   []packet // waiting to be sent
	arena   []byte   // their payloads
	closed  bool
	stopped chan struct{}

	held   atomic.Int32 // Holds not yet released: Send does not send
	queued atomic.Int32 // len(queue), for a Release to see at once that there is nothing to send
	// taken counts the packets sendQueued took out of the queue and is not
	// done with: they count against MaxQueued, so that a batch the socket
	// could not take, put back, never leaves more than the bound queued.
	taken atomic.Int32
	calls atomic.Int64 // system calls made, for the tests

	// sending is held by whoever takes the queue out and sends it: run, or
	// a Release that finds it free. It guards sys and the two below, the
	// queue and arena last sent, kept to be swapped in next time.
	sending   sync.Mutex
	sentQueue []packet
	sentArena []byte
	sys       writerSys
}

type packet struct {
	to         netip.AddrPort // the zero value on a connected socket
	start, end int            // in arena
}

// NewWriter starts a Writer on conn.
func NewWriter(conn *net.UDPConn) (*Writer, error) {
	w := &Writer{conn: conn, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	if err := w.sys.init(w); err != nil {
		return nil, err
	}
	go w.run()
	return w, nil
}

// Send queues a copy of p for to (the zero AddrPort on a connected socket)
// and sends it. It never blocks; a full queue drops the packet and returns
// ErrQueueFull. Unless the Writer is held, a packet that finds the queue
// empty and no one sending goes out at once on the caller's goroutine, in a
// system call that does not wait: a lone packet waits for no goroutine to
// wake. Otherwise it goes with the batch of whoever is sending.
func (w *Writer) Send(to netip.AddrPort, p []byte) error {
	first, err := w.Queue(to, p)
	if first {
		w.Flush()
	}
	return err
}

// Queue queues a copy of p for to without sending it, for a caller that
// holds a lock of its own: it reports whether the packet was the first in
// the queue, and then the caller must call Flush once the lock is free.
func (w *Writer) Queue(to netip.AddrPort, p []byte) (first bool, err error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false, net.ErrClosed
	}
	if len(w.queue)+int(w.taken.Load()) >= MaxQueued {
		w.mu.Unlock()
		return false, ErrQueueFull
	}
	start := len(w.arena)
	w.arena = append(w.arena, p...)
	w.queue = append(w.queue, packet{to: to, start: start, end: len(w.arena)})
	w.queued.Store(int32(len(w.queue))) // before the caller reads held: see Release
	first = len(w.queue) == 1
	w.mu.Unlock()
	return first, nil
}

// Flush sends what is queued, as Send does: at once on the caller's
// goroutine if the Writer is not held and no one is sending, else by
// whoever sends next. It never blocks.
func (w *Writer) Flush() {
	if w.held.Load() == 0 { // else the holder's Release sends it
		w.sendNow()
	}
}

// Hold stops Send from sending until a Release. A reader holds its
// socket's Writer while it answers the batch it read, so that those answers
// go out together in one system call, not one each; it must not block
// while holding (its handler never does), since every Send waits for a
// Release.
func (w *Writer) Hold() { w.held.Add(1) }

// Release ends a Hold and sends what is queued, as Send does: a reader's
// answers go out at once, with no goroutine to wake. It sends even while
// others still hold the Writer, so that holders that overlap never keep a
// packet waiting longer than one holder's batch.
func (w *Writer) Release() {
	// A Send stores queued before it reads held, and this reads queued
	// after it lowers held: a Send that saw the hold has queued its packet
	// where this sees it, or it sees no hold and sends the packet itself.
	w.held.Add(-1)
	if w.queued.Load() != 0 {
		w.sendNow()
	}
}

// sendNow sends what is queued on the caller's goroutine if no one else is
// sending and the system can send without waiting, once: a caller never
// drains what others keep queueing. Whatever the socket cannot take now,
// or what others are sending, is left to the sending goroutine.
func (w *Writer) sendNow() {
	if !sendsInline || !w.sending.TryLock() {
		w.wakeIfQueued() // run is sending: it takes the queue next
		return
	}
	w.sendQueued(false)
	w.sending.Unlock()
	w.wakeIfQueued()
}

// wakeIfQueued wakes run if anything is queued.
func (w *Writer) wakeIfQueued() {
	if w.queued.Load() != 0 {
		w.wakeUp()
	}
}

// wakeUp tells run there is something to send; a wake-up already waiting
// says as much.
func (w *Writer) wakeUp() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Close sends what is queued, then stops the Writer. It does not close the socket.
func (w *Writer) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.mu.Unlock()
	w.wakeUp()
	<-w.stopped
}

// run sends batches until Close, waiting for the socket when it must.
func (w *Writer) run() {
	defer close(w.stopped)
	for range w.wake {
		w.sending.Lock()
		closed := false
		for !closed {
			var sent bool
			sent, closed = w.sendQueued(true)
			if !sent {
				break
			}
		}
		w.sending.Unlock()
		if closed {
			return
		}
	}
}

// sendQueued swaps the queue for an empty one, so that senders never wait
// for a system call, and sends what it took. Without wait, a batch the
// socket cannot take now goes back to the queue with the rest. It reports
// whether it took anything, and whether the Writer is closed with nothing
// left. It requires that w.sending is held.
func (w *Writer) sendQueued(wait bool) (took, closedEmpty bool) {
	queue, arena, closed := w.take()
	if len(queue) == 0 {
		return false, closed
	}
	for sent := 0; sent < len(queue); { // by index: reslicing would shrink the reused slice
		w.calls.Add(1)
		n, ok := w.sys.write(w, queue[sent:min(len(queue), sent+MaxBatch)], arena, wait)
		if !ok {
			w.requeue(queue[sent:], arena)
			return true, false
		}
		w.taken.Add(-int32(n))
		sent += n
	}
	return true, false
}

// take swaps the queue for an empty one and returns what it held, which
// counts against MaxQueued (taken) until it is sent, dropped or put back,
// and whether the Writer is closed. It requires that w.sending is held.
func (w *Writer) take() (queue []packet, arena []byte, closed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	queue, arena = w.queue, w.arena
	w.queue, w.arena = w.sentQueue[:0], w.sentArena[:0]
	w.sentQueue, w.sentArena = queue, arena
	w.queued.Store(0)
	w.taken.Store(int32(len(queue)))
	return queue, arena, w.closed
}

// requeue puts ps, taken from the queue with their payloads in arena,
// back for run to send, after what was queued since (UDP answers keep no
// order). Counted as taken until now, they fit within MaxQueued.
func (w *Writer) requeue(ps []packet, arena []byte) {
	w.mu.Lock()
	for _, p := range ps {
		start := len(w.arena)
		w.arena = append(w.arena, arena[p.start:p.end]...)
		w.queue = append(w.queue, packet{to: p.to, start: start, end: len(w.arena)})
	}
	w.taken.Add(-int32(len(ps)))
	w.queued.Store(int32(len(w.queue)))
	w.mu.Unlock()
}
