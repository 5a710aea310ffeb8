package cache

import (
	"math/rand/v2"
	"testing"
)

// A shard's ghost remembers as many of its evicted hashes as it has slots,
// though every hash in a shard shares the low bits that chose the shard:
// the slot must come from the other bits. (It was h % len: in a 64 MB
// cache of 32 shards, each shard's 8,192 slots were 256 it could use.)
func TestGhostUsesItsWholeTable(t *testing.T) {
	c := newCache(t, Config{Size: 64 << 20})
	if len(c.shards) < 2 {
		t.Fatalf("%d shards: the test needs several", len(c.shards))
	}
	const shard = 3
	s := &c.shards[shard]
	slots := len(s.ghost)
	rng := rand.New(rand.NewPCG(7, 8))
	n := slots / 8 // few enough that nearly all fit
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = rng.Uint64()&^c.mask | shard // a hash this shard holds
		if c.shardOf(hashes[i]) != s {
			t.Fatalf("hash %#x is not in shard %d", hashes[i], shard)
		}
		s.ghost.put(hashes[i])
	}
	kept := 0
	for _, h := range hashes {
		if s.ghost.take(h) {
			kept++
		}
	}
	// n hashes in slots slots: a later hash lands on an earlier one's slot
	// with probability n/slots/2 on average, so ~94% are kept.
	if kept < n*8/10 {
		t.Errorf("the ghost of %d slots kept %d of %d hashes of its shard, want at least %d", slots, kept, n, n*8/10)
	}
}
