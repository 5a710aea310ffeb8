package fleet

// The lease is the tokens an instance holds from the shared bucket.
//
//   - Allow spends them with a compare-and-swap on one counter: no lock, no
//     allocation, never below zero, so an instance never spends more than it
//     was granted.
//   - Only the limiter's goroutine adds blocks and expires them. A block
//     lives leaseLife from the moment its call was sent (before Redis
//     granted it), so no token is spent more than leaseLife after the shared
//     bucket gave it out — give or take the goroutine: one that runs late
//     cuts late, and asks for the next block (one call, bounded by the
//     timeout) before it cuts.
//   - The counter does not know which block a token came from; spending is
//     taken to be oldest first. So when a block expires, what is left over
//     beyond the newer blocks' sizes was its own, and the counter is cut to
//     that sum.
//   - What was spent is read back from the counter: the goroutine knows all
//     it added and cut, the rest went to Allow.

import (
	"sync/atomic"
	"time"
)

// leaseLife is how long a granted block may be spent. The goroutine that
// cuts expired blocks can wake a little late; 900 ms keeps a token's life
// under a second with room for that.
const leaseLife = 900 * time.Millisecond

// lease is the tokens in hand. tokens and low are shared with Allow; the
// other fields belong to the limiter's goroutine.
type lease struct {
	tokens atomic.Int64 // spendable now, never negative
	low    atomic.Int64 // below this Allow asks for the next block

	blocks   []block // live blocks, oldest first
	expected int64   // tokens in hand had Allow spent nothing since the last look
}

// block is one grant: its size and when it stops being spendable.
type block struct {
	size    int64
	expires time.Time
}

// take spends n tokens if the lease holds them. ask reports that the lease
// is below its low-water mark (or short of n) and the next block is wanted.
func (s *lease) take(n int64) (ok, ask bool) {
	for {
		v := s.tokens.Load()
		if v < n {
			return false, true
		}
		if s.tokens.CompareAndSwap(v, v-n) {
			return true, v-n < s.low.Load()
		}
	}
}

// add puts a granted block in hand until expires.
func (s *lease) add(size int64, expires time.Time) {
	if size <= 0 {
		return
	}
	s.blocks = append(s.blocks, block{size: size, expires: expires})
	s.tokens.Add(size)
	s.expected += size
}

// expire drops the blocks expired at now and cuts the tokens in hand to what
// the live blocks can still hold. It returns the tokens cut.
func (s *lease) expire(now time.Time) int64 {
	dead := 0
	for dead < len(s.blocks) && !s.blocks[dead].expires.After(now) {
		dead++
	}
	if dead == 0 {
		return 0
	}
	s.blocks = append(s.blocks[:0], s.blocks[dead:]...)
	var limit int64
	for _, b := range s.blocks {
		limit += b.size
	}
	for {
		v := s.tokens.Load()
		if v <= limit {
			return 0
		}
		if s.tokens.CompareAndSwap(v, limit) {
			s.expected -= v - limit
			return v - limit
		}
	}
}

// spent returns the tokens Allow took since the last call of spent.
func (s *lease) spent() int64 {
	now := s.tokens.Load()
	n := s.expected - now
	s.expected = now
	return n
}

// heldAfter is what the lease will still hold once the blocks expiring by t
// are cut: the tokens in hand, at most the sizes of the blocks that outlive t.
func (s *lease) heldAfter(t time.Time) int64 {
	var live int64
	for _, b := range s.blocks {
		if b.expires.After(t) {
			live += b.size
		}
	}
	return min(s.tokens.Load(), live)
}

// unspentBy is what the blocks expiring by t still hold: the tokens in hand
// beyond the sizes of the blocks that outlive t (spending is taken to be
// oldest first), at most the expiring blocks' sizes.
func (s *lease) unspentBy(t time.Time) int64 {
	var live, dying int64
	for _, b := range s.blocks {
		if b.expires.After(t) {
			live += b.size
		} else {
			dying += b.size
		}
	}
	return min(max(s.tokens.Load()-live, 0), dying)
}

// nextExpiry is when the oldest live block expires; ok is false with none.
func (s *lease) nextExpiry() (t time.Time, ok bool) {
	if len(s.blocks) == 0 {
		return time.Time{}, false
	}
	return s.blocks[0].expires, true
}
