package batchio

import (
	"encoding/binary"
	"net"
	"strconv"
	"sync/atomic"

	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

type readerSys struct {
	rc     syscall.RawConn
	hdrs   []unix.Mmsghdr
	iovs   []unix.Iovec
	names  []unix.RawSockaddrAny
	recvFn func(fd uintptr) bool // s.recv, made once: a closure per call would allocate
	n      int                   // what recv got
	err    error
	// dirty is how many headers, from the first, the kernel may have written
	// since they were last made ready: recv readies only those. At moderate
	// load most calls bring a packet or two, and readying all 64 every call
	// cost more than the rest of the read.
	dirty int

	// Serve's: the handler of each batch and the callback that reads and
	// serves (made once).
	serveFn func(fd uintptr) bool
	handle  func(n int)
	reads   atomic.Int64 // recvmmsg calls, for the tests
}

func (s *readerSys) init(r *Reader) error {
	rc, err := r.conn.SyscallConn()
	if err != nil {
		return err
	}
	n := len(r.bufs)
	s.rc, s.hdrs, s.iovs, s.names = rc, make([]unix.Mmsghdr, n), make([]unix.Iovec, n), make([]unix.RawSockaddrAny, n)
	s.recvFn = s.recv
	s.serveFn = func(fd uintptr) bool { return s.serveRaw(r, fd) }
	for i := range n {
		s.iovs[i].Base = &r.bufs[i][0]
		s.iovs[i].SetLen(len(r.bufs[i]))
		s.hdrs[i].Hdr.Iov = &s.iovs[i]
		s.hdrs[i].Hdr.SetIovlen(1)
		s.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&s.names[i]))
		s.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrAny
	}
	return nil
}

func (s *readerSys) read(r *Reader) (int, error) {
	s.n, s.err = 0, nil
	if err := s.rc.Read(s.recvFn); err != nil {
		return 0, err
	}
	if s.err != nil {
		return 0, s.err
	}
	s.fill(r)
	return s.n, nil
}

// fill makes the s.n packets the last recv got readable through r.
func (s *readerSys) fill(r *Reader) {
	for i := range s.n {
		r.sizes[i] = min(int(s.hdrs[i].Len), len(r.bufs[i]))
		r.cut[i] = s.hdrs[i].Hdr.Flags&unix.MSG_TRUNC != 0
		r.addrs[i] = decodeAddr(&s.names[i], s.hdrs[i].Hdr.Namelen)
	}
}

func (s *readerSys) serve(r *Reader, handle func(n int)) error {
	s.handle = handle
	defer func() { s.handle = nil }()
	for {
		s.n, s.err = 0, nil
		if err := s.rc.Read(s.serveFn); err != nil {
			return err
		}
		if s.err != nil {
			return s.err
		}
	}
}

// serveRaw reads a batch and hands it to s.handle; it returns false to
// wait until the socket is readable, true to be called again at once (after
// its caller has checked that the socket is still open).
//
// Once a wait has begun, the poller remembers every signal of the socket
// until it ends: the kernel signals a packet that comes in (at the least one
// that finds the queue empty), and an error it queues on the socket (an ICMP
// error on a connected socket). A batch comes back short when the queue was
// empty after its last packet, or when an error that came in during the
// read cut it, with packets maybe behind it. Either way what came since was
// signalled: serveRaw can wait at once, instead of reading again to find
// nothing, the second of every wake-up's two reads at moderate load. (An
// error queued before the read is returned by its first packet, never
// cutting a batch.) That holds within one rc.Read only: a new call forgets
// the signals that came before it, so a full batch (more may be queued,
// unsignalled) or an error returns, and the next call reads first.
func (s *readerSys) serveRaw(r *Reader, fd uintptr) bool {
	if !s.recv(fd) {
		return false
	}
	if s.err != nil {
		return true
	}
	s.fill(r)
	s.handle(s.n)
	return s.n == len(s.hdrs)
}

// recv makes one recvmmsg call; it returns false to wait until the socket is readable.
//
// The kernel writes a header's lengths and flags only for a message it
// received: a call that returns n wrote the first n, a call that fails
// wrote none (any other error is treated as having written them all).
func (s *readerSys) recv(fd uintptr) bool {
	for i := range s.dirty {
		s.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrAny
		s.hdrs[i].Hdr.Flags = 0
	}
	s.dirty = 0
	s.reads.Add(1)
	r1, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(len(s.hdrs)),
		unix.MSG_DONTWAIT, 0, 0) // raw: it never waits (see send)
	switch e {
	case 0:
		s.n = int(r1)
		s.dirty = s.n
	case unix.EAGAIN, unix.EINTR:
		return false
	default:
		s.err = e
		s.dirty = len(s.hdrs)
	}
	return true
}

// decodeAddr reads an IPv4 or IPv6 socket address; anything else is the zero AddrPort.
func decodeAddr(sa *unix.RawSockaddrAny, n uint32) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		if n < unix.SizeofSockaddrInet4 {
			return netip.AddrPort{}
		}
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&in.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), port)
	case unix.AF_INET6:
		if n < unix.SizeofSockaddrInet6 {
			return netip.AddrPort{}
		}
		in := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&in.Port))[:])
		addr := netip.AddrFrom16(in.Addr).Unmap()
		if in.Scope_id != 0 && addr.Is6() {
			// A link-local client: its interface, as a number, is the
			// address's zone, so that its answer goes out where it came in.
			addr = addr.WithZone(strconv.FormatUint(uint64(in.Scope_id), 10))
		}
		return netip.AddrPortFrom(addr, port)
	}
	return netip.AddrPort{}
}

// encodeAddr writes ap as a socket address of the socket's family and returns its length.
func encodeAddr(sa *unix.RawSockaddrAny, ap netip.AddrPort, v6 bool) uint32 {
	if !v6 {
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*in = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().Unmap().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&in.Port))[:], ap.Port())
		return unix.SizeofSockaddrInet4
	}
	in := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
	*in = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ap.Addr().As16()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&in.Port))[:], ap.Port())
	if z := ap.Addr().Zone(); z != "" {
		if n, err := strconv.ParseUint(z, 10, 32); err == nil {
			in.Scope_id = uint32(n) // the interface the query came in on (decodeAddr)
		} else if ifi, err := net.InterfaceByName(z); err == nil {
			in.Scope_id = uint32(ifi.Index)
		}
	}
	return unix.SizeofSockaddrInet6
}

type writerSys struct {
	rc     syscall.RawConn
	v6     bool
	hdrs   [MaxBatch]unix.Mmsghdr
	iovs   [MaxBatch]unix.Iovec
	names  [MaxBatch]unix.RawSockaddrAny
	sendFn func(fd uintptr) bool // s.send, made once
	count  int                   // packets in hdrs for send; then how many it is done with
	wait   bool                  // send waits for the socket to be writable; else count -1: it was not
}

// sendsInline: sendmmsg can be tried without waiting, so a Release sends.
const sendsInline = true

func (s *writerSys) init(w *Writer) error {
	rc, err := w.conn.SyscallConn()
	if err != nil {
		return err
	}
	s.rc = rc
	s.sendFn = s.send
	if la, ok := w.conn.LocalAddr().(*net.UDPAddr); ok {
		s.v6 = la.IP.To4() == nil
	}
	return nil
}

// write sends the packets in one sendmmsg and returns how many it is done
// with: sent, or dropped because the kernel refused them. Without wait, it
// reports false if the socket could not take any now.
func (s *writerSys) write(w *Writer, ps []packet, arena []byte, wait bool) (int, bool) {
	for i, p := range ps {
		h := &s.hdrs[i].Hdr
		s.iovs[i].Base = nil // an empty packet, an empty datagram: no byte to point at
		if p.end > p.start {
			s.iovs[i].Base = &arena[p.start]
		}
		s.iovs[i].SetLen(p.end - p.start)
		h.Iov = &s.iovs[i]
		h.SetIovlen(1)
		h.Name, h.Namelen = nil, 0
		if p.to.IsValid() {
			h.Name = (*byte)(unsafe.Pointer(&s.names[i]))
			h.Namelen = encodeAddr(&s.names[i], p.to, s.v6)
		}
	}
	s.count, s.wait = len(ps), wait
	if err := s.rc.Write(s.sendFn); err != nil || s.count == 0 {
		return len(ps), true // the socket is closed: nothing more will go out
	}
	if s.count < 0 {
		return 0, false
	}
	return s.count, true
}

// send makes one sendmmsg call; it returns false to wait until the socket is writable.
//
// Both calls here are made raw, outside the scheduler's system-call path:
// with MSG_DONTWAIT neither ever sleeps (a full socket answers EAGAIN and
// the goroutine waits in the poller instead), so there is no P to hand
// over while they run. The scheduler's path would cost every call its
// bookkeeping and, whenever the process had been idle, a wake-up of the
// runtime's monitor thread, which then sleeps again: at 1,000 queries/s
// that was 4 of the 6.5 context switches a query cost the proxy
// (TestLonePacketsWakeNoMonitor). A sendmmsg of a full batch on loopback
// runs the receivers' side of the stack too, some tens of microseconds in
// which this P runs nothing else, as it would run Go code for as long.
//
// An error fails the call's first packet, and it may not be that packet's:
// on a connected socket the kernel reports an ICMP error an earlier packet
// drew (port unreachable, forged or not) to the next send, which then sends
// nothing and clears the error. So the call is made once more: a packet
// the kernel refuses for itself fails again and is dropped; one that only
// met an earlier packet's error goes out, not left to time out
// (TestQueuedICMPErrorDoesNotDropTheNextPacket).
func (s *writerSys) send(fd uintptr) bool {
	for try := 0; ; try++ {
		r1, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(s.count),
			unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			s.count = int(r1)
		case unix.EAGAIN, unix.EINTR:
			if !s.wait {
				s.count = -1
				return true
			}
			return false
		default:
			if try == 0 {
				continue // the error may be an earlier packet's, now cleared
			}
			s.count = 1 // the first packet was refused twice: drop it, go on
		}
		return true
	}
}
