# dnsperfstats.awk: one dnsperf run's output reduced to one line of figures, for compare.sh.
#
#   awk -f scripts/dnsperfstats.awk dnsperf.out
#
# prints "qps avg_us p50_us p99_us noerror% lost% other", or "fail" when no query was sent or no
# rate was reported:
#   qps       the rate dnsperf reached (queries per second, rounded);
#   avg_us    its average latency in microseconds ("-" when dnsperf gave none);
#   p50_us    the median latency and p99_us the 99th percentile, in microseconds, of the answered
#             queries; "-" when the run had no -v lines (dnsperf -v prints one per answer:
#             "> NOERROR name type 0.000123"; a timed-out query, "> T name type", has no latency);
#   noerror%  the share of the answers that were NOERROR;
#   lost%     the share of the queries sent that were never answered;
#   other     the commonest response code other than NOERROR, empty when there was none.
#
# The percentiles are nearest-rank over a histogram: exact to the microsecond below 1 ms, to three
# significant digits above (1.23 ms, 45.6 ms), so the memory is bounded whatever the run's length.

# bucket: the histogram key of a latency of us microseconds, rounded down to three significant digits.
function bucket(us, step) {
	step = 1
	while (us >= 1000 * step) step *= 10
	return int(us / step) * step
}

# next_bucket: the key after k in the histogram's order.
function next_bucket(k, step) {
	step = 1
	while (k >= 1000 * step) step *= 10
	return k + step
}

$1 == ">" && $2 != "T" && $NF ~ /^[0-9]+\.[0-9]+$/ {
	k = bucket(int($NF * 1000000 + 0.5))
	hist[k]++
	answered++
	if (k > top) top = k
	next
}
/Queries sent:/ { sent = $3 }
/Queries lost:/ { lost = $3 }
/Response codes:/ {
	for (i = 3; i < NF; i += 3) {
		codes += $(i + 1)
		if ($i == "NOERROR") ok = $(i + 1)
		else if ($(i + 1) > most) { most = $(i + 1); other = $i }
	}
}
/Queries per second:/ { qps = $4 }
/Average Latency/ { lat = $4 * 1000000 }

# rank: the smallest latency that at least pct percent of the answered queries did not exceed;
# the rank is counted in integers, so no rounding of pct / 100 moves it.
function rank(pct, need, seen, k) {
	need = int((pct * answered + 99) / 100)
	if (need < 1) need = 1
	for (k = 0; k <= top; k = next_bucket(k)) {
		if (k in hist) seen += hist[k]
		if (seen >= need) return k
	}
	return top
}

END {
	if (sent == 0 || qps == "") { print "fail"; exit }
	p50 = "-"; p99 = "-"
	if (answered > 0) { p50 = rank(50); p99 = rank(99) }
	avg = lat == "" ? "-" : sprintf("%.0f", lat)
	printf "%.0f %s %s %s %.1f %.2f %s\n", qps, avg, p50, p99, codes ? 100 * ok / codes : 0, 100 * lost / sent, other
}
