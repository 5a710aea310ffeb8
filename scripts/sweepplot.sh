#!/usr/bin/env bash
# sweepplot.sh: draw the table of a latency sweep (make compare SWEEP=1) as a PNG with gnuplot.
#
# Usage: scripts/sweepplot.sh TABLE.tsv OUT.png [TITLE]
#
# TABLE is compare.sh's sweep table: tab-separated, '#' lines for comments, a header line (its
# first word "forwarder"), one row per forwarder and offered load: forwarder, offered, achieved,
# avg_us, p50_us, p99_us, lost%, noerror% ("-" for a figure missing). The PNG has two panels, the
# offered load (queries per second) on x: latency (log-log; solid: average, dashed: 99th
# percentile) and the rate reached (linear, so where a forwarder leaves the diagonal of the offered
# rate shows). One colour per forwarder, the same in every picture. TITLE (lines separated by
# newlines, folded at 110 characters) defaults to the table's '#' lines. OUT.gp, written beside
# the PNG, is the gnuplot program that drew it, data included: run gnuplot on it in its directory
# to redraw or restyle.
set -euo pipefail

say() { echo "sweepplot: $*" >&2; }
if [ $# -lt 2 ] || [ $# -gt 3 ]; then say "usage: $0 TABLE.tsv OUT.png [TITLE]"; exit 2; fi
table=$1 png=$2
[ -r "$table" ] || { say "cannot read the table $table"; exit 2; }
command -v gnuplot >/dev/null || { say "gnuplot is missing (apt-get install -y gnuplot-nox)"; exit 1; }
title=$(if [ $# = 3 ]; then printf '%s\n' "$3"; else sed -n 's/^# \{0,1\}//p' "$table"; fi | fold -s -w 110)

# The rows grouped by forwarder (first-seen order), each group sorted by offered load, become the
# program's datablocks $d1, $d2...: gnuplot draws each as one line, and the program stands alone.
rows=$(awk -F'\t' -v table="$table" '
	/^#/ || /^[ \t]*$/ || $1 == "forwarder" { next }
	NF < 6 || $2 !~ /^[0-9]+$/ || $1 !~ /^[A-Za-z0-9_.-]+$/ { bad = NR; exit }
	!($1 in seen) { seen[$1] = ++n }
	{ print seen[$1] "\t" $0 }
	END { if (bad) { printf "sweepplot: %s line %d: want forwarder (letters, digits, . _ -), offered (an integer), achieved, avg_us, p50_us, p99_us ...\n", table, bad > "/dev/stderr"; exit 1 } }
	' "$table" | sort -t "$(printf '\t')" -k1,1n -k3,3n) || exit 2
[ -n "$rows" ] || { say "$table has no rows"; exit 2; }
fwds=$(cut -f2 <<<"$rows" | uniq | tr '\n' ' ')
datablocks=$(awk -F'\t' '
	$1 != last { if (last != "") print "EOD"; printf "$d%d << EOD\n", $1; last = $1 }
	{ sub(/^[0-9]+\t/, ""); print }
	END { print "EOD" }' <<<"$rows")

# One colour per forwarder, the same in every picture; dnsproxi drawn thicker.
colour() {
	case $1 in
	dnsproxi) echo "#d62728" ;; dnsdist) echo "#1f77b4" ;; coredns) echo "#2ca02c" ;;
	unbound) echo "#ff7f0e" ;; dnsmasq) echo "#9467bd" ;; plain) echo "#e377c2" ;;
	base) echo "#8c564b" ;; direct) echo "#404040" ;; *) echo "#17becf" ;;
	esac
}
colours=$(for f in $fwds; do printf '%s ' "$(colour "$f")"; done)

# The tics: every offered load of the table, written 1k, 15k, 1.5M; the range a little wider.
loads=$(cut -f3 <<<"$rows" | sort -nu)
tics=$(awk '
	{ v = $1; s = v >= 1e6 ? sprintf("%gM", v / 1e6) : v >= 1e3 ? sprintf("%gk", v / 1e3) : v
	  printf "%s\"%s\" %d", (NR > 1 ? ", " : ""), s, v }' <<<"$loads")
range=$(awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "[%g:%g]", lo / 1.25, hi * 1.25 }' <<<"$loads")
hi=$(awk '{ hi = $1 } END { printf "%g", hi * 1.05 }' <<<"$loads")
# The rates' tics: 10k, 20k when gnuplot's steps are whole thousands; 500, 1000 below that.
qformat=$(awk -v hi="$hi" 'BEGIN { print (hi >= 10000 ? "%.0s%c" : "%g") }')
# The latency range: from the power of ten below the least average to the one above the worst p99
# (the two figures drawn).
lat_range=$(awk -F'\t' '
	function see(v) { if (v !~ /^[0-9.]+$/ || v <= 0) return; if (lo == "" || v < lo) lo = v; if (v > hi) hi = v }
	{ see($5); see($7) }
	END { if (lo == "") { print "[*:*]"; exit }; a = 1; while (a * 10 <= lo) a *= 10; b = 1; while (b < hi) b *= 10; printf "[%g:%g]", a * 0.999, b }' <<<"$rows")
# gnuplot's title: a double-quoted string, its lines joined by \n.
title=$(printf '%s' "$title" | sed 's/\\/\\\\/g; s/"/\\"/g' | awk '{ printf "%s%s", (NR > 1 ? "\\n" : ""), $0 }')

gp=${png%.png}.gp
name=$(basename "$gp")
cat >"$gp" <<GP
# gnuplot program written by scripts/sweepplot.sh from $table; run it in its directory to redraw
set terminal pngcairo size 1100,1150 font "DejaVu Sans,11" noenhanced
set encoding utf8
set output "$(basename "$png")"
$datablocks
fwds = "$fwds"
colours = "$colours"
set datafile separator "\t"
set datafile missing "-"
set multiplot layout 2,1 title "$title" font ",12"
set logscale x
set xrange $range
set xtics ($tics) rotate by -30
set lmargin 12
set grid xtics ytics mytics lc rgb "#dddddd"
set key outside right top vertical Left reverse samplen 3 spacing 1.2
set xlabel "offered load (queries/s)"
set ylabel "latency"
set logscale y
set yrange $lat_range
set ytics ("1 µs" 1, "10 µs" 10, "100 µs" 100, "1 ms" 1e3, "10 ms" 1e4, "100 ms" 1e5, "1 s" 1e6, "10 s" 1e7)
set title "latency against offered load (solid: average, dashed: 99th percentile)"
plot for [i=1:words(fwds)] sprintf('\$d%d', i) using 2:4 with linespoints lc rgb word(colours, i) lw (word(fwds, i) eq "dnsproxi" ? 3 : 2) pt 7 ps 0.8 title word(fwds, i), \\
     for [i=1:words(fwds)] sprintf('\$d%d', i) using 2:6 with linespoints lc rgb word(colours, i) lw 1.5 dt 2 pt 6 ps 0.8 notitle
set ylabel "answers per second reached"
set title "rate reached against offered load (dotted: the rate offered, every query answered)"
unset logscale
set ytics auto
set mytics default
set xrange [0:$hi]
set yrange [0:$hi]
set xtics auto
set format x "$qformat"
set format y "$qformat"
set xtics norotate
plot x with lines lc rgb "#999999" lw 1.5 dt 3 title "offered", \\
     for [i=1:words(fwds)] sprintf('\$d%d', i) using 2:3 with linespoints lc rgb word(colours, i) lw (word(fwds, i) eq "dnsproxi" ? 3 : 2) pt 7 ps 0.8 title word(fwds, i)
unset multiplot
GP
err=$( (cd "$(dirname "$gp")" && gnuplot "$name") 2>&1) || { say "gnuplot failed: $(head -n 3 <<<"$err" | tr '\n' ' ')"; exit 1; }
say "drew $png (its gnuplot program: $gp)"
