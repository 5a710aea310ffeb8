package guard

import "testing"

// BenchmarkRetryBudget is what every forwarded query pays (Deposit) and what
// a retry or hedge pays (Withdraw), on the real clock.
func BenchmarkRetryBudget(b *testing.B) {
	b.Run("deposit", func(b *testing.B) {
		rb := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1}, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			rb.Deposit()
		}
	})
	b.Run("withdraw", func(b *testing.B) {
		rb := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1}, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			rb.Deposit()
			rb.Withdraw()
		}
	})
	b.Run("deposit-parallel", func(b *testing.B) {
		rb := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1}, RealClock{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rb.Deposit()
			}
		})
	})
}
