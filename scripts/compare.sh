#!/usr/bin/env bash
# compare.sh: dnsproxi side by side with other DNS forwarders, all in front of a local NSD on loopback.
#
# Usage: make compare [NAME=value ...]    or    NAME=value ... scripts/compare.sh
#        make compare HELP=1              or    scripts/compare.sh -h        (this help)
#
# It builds dnsproxi from this working tree, starts it and every peer on 127.0.0.1, all forwarding to
# the same NSD, and loads each in turn with dnsperf. Rounds are interleaved: a round runs every
# forwarder once, always in the same order (dnsproxi, then PEERS), so a noisy machine hits everyone
# alike. It prints one line per run, then each forwarder's median and its ratio to dnsproxi.
#
#   make compare                                      # dnsproxi against every installed peer
#   make compare PEERS="plain dnsdist direct" PROXY_ENV='DNS_RATE_LIMIT=10000000 DNS_BREAKER_THRESHOLD=50'
#   make compare PEERS=base BASE_BIN=/tmp/dnsproxi-main   # a change against the binary it replaces
#   make compare RATE=15000                           # latency at a fixed rate instead of QPS
#   make compare SWEEP=1 OUT=/tmp/curve               # latency and rate reached from 1k q/s upwards: a PNG
#
# PEERS         what runs beside dnsproxi, in this order. Default: whichever of dnsdist coredns
#               unbound dnsmasq are installed. Names:
#                 dnsdist unbound dnsmasq  installed with apt-get when missing (dnsmasq-base);
#                 coredns  not in Debian: a `coredns` on PATH, or COREDNS=/path; skipped if absent;
#                 plain    the same dnsproxi binary without PROXY_ENV (its gates' cost, interleaved);
#                 base     another dnsproxi binary, BASE_BIN=/path, run with BASE_ENV;
#                 direct   dnsperf straight at the (first) NSD: the ceiling no forwarder can pass.
# PROXY_ENV     extra environment for dnsproxi, NAME=value words: 'DNS_RATE_LIMIT=1000000 ...'.
#               DNS_* variables of the caller's own environment are ignored: put them here.
# BASE_BIN      the dnsproxi binary that 'base' runs (e.g. main's, built before a change).
# BASE_ENV      environment for 'base' (default: PROXY_ENV). Applied after the script's own, so
#               BASE_ENV='DNS_UPSTREAM=127.0.0.1:15300' gives an older base one upstream.
# ROUNDS        rounds (3).                SECONDS_EACH  seconds per run (8).
# CLIENTS       dnsperf clients (8).       OUTSTANDING   queries outstanding, dnsperf -q (500; RATE, SWEEP: 100).
# RATE          queries per second: measure the average latency (microseconds) at this fixed rate
#               instead of QPS, with its 99th percentile beside it (p99_us); the ratio is then
#               dnsproxi's average latency over the peer's (below 1 is better). Each line also shows
#               the rate reached: below RATE, that forwarder could not keep up (the summary counts
#               the runs below 95% of RATE).
# SWEEP         a latency sweep: RATE at one offered load after another, every forwarder interleaved
#               within each load, ROUNDS rounds each, the medians written as a table (sweep.tsv:
#               forwarder, offered, achieved, avg_us, p50_us, p99_us, lost%, noerror%) and drawn
#               with gnuplot (sweep.png: latency and rate reached against offered load). SWEEP=1
#               offers 1000 5000 15000 30000 45000 60000 q/s, then ×1.5 steps; SWEEP="1000 5000
#               15000" offers those loads, and a last word + goes on upwards from there by ×1.5.
#               A forwarder that falls behind at a load (its median reaches less than 95% of it,
#               loses any query, or has under 99% NOERROR answers) is not offered more; the sweep
#               ends when no forwarder but direct keeps up. gnuplot-nox is installed when missing.
# SWEEP_STEPS   the most loads a sweep offers (12).
# SWEEP_MINUTES the sweep offers no further load that would take it past this many minutes (60).
# OUT           the directory of sweep.tsv, sweep.png and sweep.gp (default: the work directory,
#               kept and printed; an existing sweep there is replaced).
# PROTO         udp (default) or tcp: the transport dnsperf uses towards the forwarders.
# MIX           unique (default; every name new, so no cache can help) or zipf (500,000 queries over
#               20,000 names, Zipf s=1, like real traffic: a cache's hit rate settles near 97%).
# CACHE=1       turn the peers' caches on: dnsdist packet cache, CoreDNS `cache`, dnsmasq cache-size,
#               Unbound's own. Off by default (Unbound: cache-max-ttl 0), as dnsproxi has none.
# QUERIES       a dnsperf query file to send instead of MIX.
# UPSTREAMS     how many NSD instances (1). Every forwarder gets all of them; dnsproxi's DNS_UPSTREAM
#               lists them comma-separated; 'direct' measures the first.
# COREDNS       the coredns binary: a path, or a name on PATH (coredns).
# BENCH_PORT_BASE  port base B (default: the first of 15300, 15500, ... 17100 whose ports are free):
#               NSD B.., dnsproxi B+98 (its /metrics B+97), plain B+99, base B+100, coredns B+101,
#               dnsdist B+102, unbound B+103, dnsmasq B+104.
# KEEP=1        keep the work directory (configs, logs, query file) and print where it is.
# GO            the go command that builds dnsproxi (go).
#
# Everything listens on 127.0.0.1 only, and everything the script starts is stopped when it exits,
# on Ctrl-C too. scripts/compare.md says how it measures and how to read the figures.
set -euo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
	sed -n '2,/^[^#]/{/^#/!d; s/^# \{0,1\}//; p}' "$0"
	exit 0
fi
[ $# -eq 0 ] || { echo "compare: unexpected argument '$1': it is configured through the environment (-h)" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "compare: $*" >&2; }
fail() { say "$*"; exit 1; }

# want_int NAME MIN: the variable NAME must be an integer >= MIN; one line and exit 2 otherwise.
want_int() {
	local v=${!1}
	if ! [[ $v =~ ^[0-9]+$ ]] || [ "$v" -lt "$2" ]; then
		say "$1=\"$v\": want an integer of at least $2"
		exit 2
	fi
}
ROUNDS=${ROUNDS:-3}; want_int ROUNDS 1
SECONDS_EACH=${SECONDS_EACH:-8}; want_int SECONDS_EACH 1
CLIENTS=${CLIENTS:-8}; want_int CLIENTS 1
UPSTREAMS=${UPSTREAMS:-1}; want_int UPSTREAMS 1
[ "$UPSTREAMS" -le 90 ] || { say "UPSTREAMS=\"$UPSTREAMS\": want at most 90 (they sit below B+97)"; exit 2; }
RATE=${RATE:-}; [ -z "$RATE" ] || want_int RATE 1
SWEEP=${SWEEP:-}
sweep_loads=() sweep_up=""
if [ -n "$SWEEP" ]; then
	[ -z "$RATE" ] || { say "SWEEP=\"$SWEEP\" and RATE=\"$RATE\": set one of them (a sweep offers its own loads)"; exit 2; }
	if [ "$SWEEP" = 1 ]; then
		sweep_loads=(1000 5000 15000 30000 45000 60000) sweep_up=1
	else
		last=0
		read -r -a words <<<"$SWEEP"
		for w in "${words[@]}"; do
			if [ "$w" = + ] && [ -z "$sweep_up" ] && [ "$last" -gt 0 ]; then sweep_up=1; continue; fi
			if [ -n "$sweep_up" ] || ! [[ $w =~ ^[1-9][0-9]{0,7}$ ]] || [ "$w" -le "$last" ]; then
				say "SWEEP=\"$SWEEP\": want 1, or rising loads in queries per second (\"1000 5000 15000\"), + last to go on upwards"
				exit 2
			fi
			sweep_loads+=("$w") last=$w
		done
		[ ${#sweep_loads[@]} -gt 0 ] || { say "SWEEP=\"$SWEEP\": want 1, or rising loads in queries per second"; exit 2; }
	fi
	SWEEP_STEPS=${SWEEP_STEPS:-12}; want_int SWEEP_STEPS 1
	SWEEP_MINUTES=${SWEEP_MINUTES:-60}; want_int SWEEP_MINUTES 1
	if [ -n "${OUT:-}" ]; then
		if ! mkdir -p "$OUT" 2>/dev/null || ! [ -w "$OUT" ]; then say "OUT=\"$OUT\": cannot write a directory there"; exit 2; fi
		OUT=$(cd "$OUT" && pwd)
	fi
fi
OUTSTANDING=${OUTSTANDING:-$([ -n "$RATE$SWEEP" ] && echo 100 || echo 500)}; want_int OUTSTANDING 1
PROTO=${PROTO:-udp}
case $PROTO in udp | tcp) ;; *) say "PROTO=\"$PROTO\": want udp or tcp"; exit 2 ;; esac
MIX=${MIX:-unique}
case $MIX in unique | zipf) ;; *) say "MIX=\"$MIX\": want unique or zipf"; exit 2 ;; esac
CACHE=${CACHE:-}
PROXY_ENV=${PROXY_ENV:-}
BASE_ENV=${BASE_ENV-$PROXY_ENV}
GO=${GO:-go}
COREDNS=${COREDNS:-coredns}
COREDNS=$(command -v "$COREDNS" || echo "$COREDNS")   # a name on PATH or a path
if [ -z "${PEERS+set}" ]; then
	PEERS=""
	for p in dnsdist coredns unbound dnsmasq; do
		case $p in
		coredns) [ -x "$COREDNS" ] && PEERS+=" coredns" ;;
		*) command -v "$p" >/dev/null && PEERS+=" $p" ;;
		esac
	done
fi
for p in $PEERS; do
	case $p in dnsdist | coredns | unbound | dnsmasq | plain | base | direct) ;;
	*) say "PEERS names '$p': want some of dnsdist coredns unbound dnsmasq plain base direct"; exit 2 ;;
	esac
done
for v in $(compgen -e); do   # dnsproxi, plain and base get only what this script passes them
	case $v in DNS_*) say "ignoring $v from the environment (put it in PROXY_ENV)"; unset "$v" ;; esac
done

work=$(mktemp -d /tmp/dnscompare.XXXXXX)
[ -z "$SWEEP" ] || OUT=${OUT:-$work}

# Every daemon runs in its own session, so its process group has its pid, kept in $work/NAME.pgid;
# stopping a group also stops the processes a daemon forked (NSD's).
sessions() { cat "$work"/*.pgid 2>/dev/null || true; }
stop_all() {
	local g i alive
	for g in $(sessions); do kill -TERM -- "-$g" 2>/dev/null || true; done
	for i in $(seq 1 50); do   # up to 5 s to stop cleanly, then SIGKILL
		alive=0
		for g in $(sessions); do kill -0 -- "-$g" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		[ "$i" = 50 ] || sleep 0.1
	done
	for g in $(sessions); do kill -KILL -- "-$g" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
cleanup() {
	trap - EXIT INT TERM
	stop_all
	if [ -n "${KEEP:-}" ]; then
		say "kept $work"
	elif [ "${OUT:-}" = "$work" ] && compgen -G "$work/sweep.*" >/dev/null; then   # keep the sweep, not the bench
		find "$work" -mindepth 1 -maxdepth 1 ! -name 'sweep.*' -exec rm -rf {} +
		say "kept the sweep in $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# install PACKAGE: apt-get install it (as root, or through sudo without a password).
apt_ready=""
install() {
	local sudo=()
	if [ "$(id -u)" != 0 ]; then
		sudo -n true 2>/dev/null || { say "$1 is missing and cannot be installed without root: apt-get install -y $1"; return 1; }
		sudo=(sudo -n)
	fi
	say "installing $1"
	if [ -z "$apt_ready" ]; then "${sudo[@]}" apt-get update -qq >>"$work/apt.log" 2>&1 || true; apt_ready=1; fi
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$1" >>"$work/apt.log" 2>&1 ||
		{ say "apt-get install -y $1 failed: $(tail -n 1 "$work/apt.log")"; return 1; }
}
# need COMMAND PACKAGE: COMMAND is on PATH, installing PACKAGE if it is not.
need() { command -v "$1" >/dev/null || { install "$2" && command -v "$1" >/dev/null; }; }

need dnsperf dnsperf || fail "dnsperf is needed"
need nsd nsd || fail "nsd is needed"
need dig bind9-dnsutils || fail "dig is needed"
command -v "$GO" >/dev/null || fail "$GO is needed to build dnsproxi"
if [ -n "$SWEEP" ] && ! need gnuplot gnuplot-nox; then
	say "gnuplot is missing: the sweep writes its table only (draw it later: scripts/sweepplot.sh TABLE PNG)"
fi
peers=()
for p in $PEERS; do
	case $p in
	dnsdist | unbound) need "$p" "$p" || { say "skipping $p"; continue; } ;;
	dnsmasq) need dnsmasq dnsmasq-base || { say "skipping dnsmasq"; continue; } ;;
	coredns) [ -x "$COREDNS" ] || { say "skipping coredns: it is not in Debian; put a coredns on PATH or set COREDNS=/path"; continue; } ;;
	base) [ -x "${BASE_BIN:-}" ] || { say "skipping base: set BASE_BIN=/path/to/dnsproxi"; continue; } ;;
	esac
	peers+=("$p")
done

# Ports: upstreams from B, the forwarders at fixed offsets above it.
declare -A offset=([metrics]=97 [dnsproxi]=98 [plain]=99 [base]=100 [coredns]=101 [dnsdist]=102 [unbound]=103 [dnsmasq]=104)
busy() { [ -n "$(ss -Hln "( sport = :$1 )" 2>/dev/null)" ]; }
ports_free() {   # ports_free B: every port this run would use from base B is free, UDP and TCP
	local i p
	for ((i = 0; i < UPSTREAMS; i++)); do busy $(($1 + i)) && return 1; done
	for p in metrics dnsproxi "${peers[@]}"; do
		[ "$p" = direct ] && continue
		busy $(($1 + ${offset[$p]})) && return 1
	done
	return 0
}
command -v ss >/dev/null || say "ss is missing: cannot check that the ports are free"
if [ -n "${BENCH_PORT_BASE:-}" ]; then
	want_int BENCH_PORT_BASE 1024
	B=$BENCH_PORT_BASE
	ports_free "$B" || fail "a port from BENCH_PORT_BASE=$B is in use; choose another"
else
	B=""
	for b in $(seq 15300 200 17100); do ports_free "$b" && { B=$b; break; }; done
	[ -n "$B" ] || fail "no free port range from 15300 to 17200; set BENCH_PORT_BASE"
fi
port() { echo $((B + ${offset[$1]})); }

# start NAME COMMAND...: start a daemon in its own session, its output in $work/NAME.log. The
# session's pid is read from inside it, as setsid forks when its caller leads a process group.
start() {
	local name=$1 i
	shift
	# shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
	setsid sh -c 'echo $$ >"$0"; exec "$@"' "$work/$name.pgid" "$@" >"$work/$name.log" 2>&1 </dev/null &
	for i in $(seq 1 250); do   # up to 5 s
		[ -s "$work/$name.pgid" ] && return 0
		sleep 0.02
	done
	fail "$name did not start"
}
# ready NAME PORT: wait until www.example.com answers through PORT: 40 tries of at most 1.1 s.
ready() {
	local pid i
	pid=$(cat "$work/$1.pgid")
	for i in $(seq 1 40); do
		if ! kill -0 "$pid" 2>/dev/null; then
			say "$1 exited at start: $(tail -n 3 "$work/$1.log" | tr '\n' ' ')"
			return 1
		fi
		dig @127.0.0.1 -p "$2" www.example.com A +short +time=1 +tries=1 2>/dev/null | grep -qx 192.0.2.2 && return 0
		[ "$i" = 40 ] || sleep 0.1
	done
	say "$1: nothing answers on 127.0.0.1:$2: $(tail -n 3 "$work/$1.log" | tr '\n' ' ')"
	return 1
}

# The upstreams: NSD serving one zone with a wildcard (every name answers NOERROR), no rate limit.
{
	cat <<'ZONE'
$ORIGIN example.com.
$TTL 300
@   IN SOA ns1.example.com. hostmaster.example.com. 1 7200 3600 1209600 300
@   IN NS  ns1.example.com.
ns1 IN A   192.0.2.53
@   IN A   192.0.2.1
www IN A   192.0.2.2
*   IN A   192.0.2.3
ZONE
	for i in $(seq 1 12); do printf 'big IN TXT "%s%d"\n' "$(printf 'b%.0s' $(seq 1 200))" "$i"; done   # > 512 bytes: TC, then TCP
} >"$work/example.com.zone"
upstreams=()
for ((i = 0; i < UPSTREAMS; i++)); do
	up=$((B + i))
	mkdir -p "$work/nsd$i"
	cat >"$work/nsd$i/nsd.conf" <<CONF
server:
  ip-address: 127.0.0.1@$up
  server-count: 1
  username: ""
  chroot: ""
  zonesdir: "$work"
  database: ""
  pidfile: "$work/nsd$i/nsd.pid"
  xfrdfile: "$work/nsd$i/xfrd.state"
  zonelistfile: "$work/nsd$i/zone.list"
  verbosity: 0
  rrl-ratelimit: 0
  rrl-whitelist-ratelimit: 0
remote-control:
  control-enable: no
zone:
  name: example.com
  zonefile: example.com.zone
CONF
	start "nsd$i" nsd -d -c "$work/nsd$i/nsd.conf"
	ready "nsd$i" "$up" || fail "the upstream NSD did not start"
	upstreams+=("127.0.0.1:$up")
done
upstream_list=$(IFS=,; echo "${upstreams[*]}")

if [ -n "${QUERIES:-}" ]; then
	[ -r "$QUERIES" ] || fail "QUERIES=$QUERIES: cannot read it"
else
	QUERIES=$work/queries.txt
	if [ "$MIX" = zipf ]; then
		awk 'BEGIN{srand(7); n=20000; for(i=1;i<=n;i++){t+=1/i; c[i]=t}
		  for(q=0;q<500000;q++){u=rand()*t; lo=1; hi=n; while(lo<hi){m=int((lo+hi)/2); if(c[m]<u) lo=m+1; else hi=m}
		    printf "n%d.example.com A\n", lo}}' >"$QUERIES"
	else
		awk 'BEGIN{srand(7); for(i=0;i<500000;i++) printf "r%d-%d.example.com A\n", i, int(rand()*1e9)}' >"$QUERIES"
	fi
fi

say "building dnsproxi from $repo"
(cd "$repo" && "$GO" build -o "$work/dnsproxi" .) || fail "go build failed"

# proxy NAME BINARY ENV-WORDS: one dnsproxi on its port, forwarding to every upstream.
proxy() {
	local metrics=off
	[ "$1" = dnsproxi ] && metrics=127.0.0.1:$(port metrics)
	# shellcheck disable=SC2086 # the env words are split on purpose
	start "$1" env DNS_LISTEN="127.0.0.1:$(port "$1")" DNS_UPSTREAM="$upstream_list" DNS_METRICS_ADDR="$metrics" $3 "$2"
	ready "$1" "$(port "$1")"
}

order=()
declare -A target
if proxy dnsproxi "$work/dnsproxi" "$PROXY_ENV"; then
	order+=(dnsproxi); target[dnsproxi]=$(port dnsproxi)
else
	say "dnsproxi did not start: the peers run without a ratio"
fi
for p in "${peers[@]}"; do
	if [ "$p" = direct ]; then pp=$B; else pp=$(port "$p"); fi
	case $p in
	direct) ;;
	plain) proxy plain "$work/dnsproxi" "" || continue ;;
	base) proxy base "$BASE_BIN" "$BASE_ENV" || continue ;;
	dnsdist)
		{
			printf 'setSecurityPollSuffix("")\nsetLocal("127.0.0.1:%s")\n' "$pp"
			for u in "${upstreams[@]}"; do printf 'newServer({address="%s", checkInterval=3600})\n' "$u"; done
			[ -z "$CACHE" ] || printf 'pc = newPacketCache(100000)\ngetPool(""):setCache(pc)\n'
		} >"$work/dnsdist.conf"
		start dnsdist dnsdist -C "$work/dnsdist.conf" --supervised --disable-syslog
		ready dnsdist "$pp" || continue ;;
	coredns)
		printf '.:%s {\n  bind 127.0.0.1\n  forward . %s\n%s}\n' "$pp" "${upstreams[*]}" "${CACHE:+  cache 300
}" >"$work/Corefile"
		start coredns "$COREDNS" -conf "$work/Corefile" -quiet
		ready coredns "$pp" || continue ;;
	unbound)   # a caching resolver forwarding everything; a zero cache-max-ttl keeps no answer
		{
			printf 'server:\n  interface: 127.0.0.1\n  port: %s\n  outgoing-interface: 127.0.0.1\n  do-ip6: no\n' "$pp"
			printf '  do-daemonize: no\n  chroot: ""\n  username: ""\n  directory: "%s"\n  pidfile: ""\n  use-syslog: no\n' "$work"
			printf '  num-threads: 2\n  access-control: 127.0.0.0/8 allow\n  do-not-query-localhost: no\n  module-config: "iterator"\n'
			printf '  ratelimit: 0\n  ip-ratelimit: 0\n  qname-minimisation: no\n  harden-referral-path: no\n  verbosity: 0\n'
			if [ -n "$CACHE" ]; then printf '  msg-cache-size: 64m\n  rrset-cache-size: 128m\n'; else printf '  cache-max-ttl: 0\n'; fi
			printf 'remote-control:\n  control-enable: no\nforward-zone:\n  name: "."\n'
			for u in "${upstreams[@]}"; do printf '  forward-addr: %s\n' "${u/:/@}"; done
		} >"$work/unbound.conf"
		start unbound unbound -d -c "$work/unbound.conf"
		ready unbound "$pp" || continue ;;
	dnsmasq)
		args=(-k -C /dev/null --port="$pp" --listen-address=127.0.0.1 --bind-interfaces --no-resolv --no-hosts
			--cache-size="$([ -n "$CACHE" ] && echo 100000 || echo 0)" --dns-forward-max=10000 --pid-file="$work/dnsmasq.pid")
		[ "$(id -u)" = 0 ] && args+=(--user=root)   # dnsmasq-base alone has no dnsmasq user to drop to
		for u in "${upstreams[@]}"; do args+=(--server="${u/:/#}"); done
		start dnsmasq dnsmasq "${args[@]}"
		ready dnsmasq "$pp" || continue ;;
	esac
	order+=("$p"); target[$p]=$pp
done
[ ${#order[@]} -gt 0 ] || fail "nothing to measure"

version() {
	case $1 in
	dnsproxi) git -C "$repo" describe --always --dirty 2>/dev/null || echo "working tree" ;;
	base) echo "$BASE_BIN" ;;
	plain) echo "dnsproxi without PROXY_ENV" ;;
	direct) echo "NSD $(nsd -v 2>&1 | awk 'NR==1{print $3}')" ;;
	dnsdist) dnsdist --version 2>/dev/null | awk 'NR==1{print $2}' ;;
	coredns) "$COREDNS" -version 2>/dev/null | awk 'NR==1{print $1}' ;;
	unbound) unbound -V 2>/dev/null | awk 'NR==1{print $2}' ;;
	dnsmasq) dnsmasq --version 2>/dev/null | awk 'NR==1{print $3}' ;;
	esac
}
if [ -n "$SWEEP" ]; then
	load="at most $OUTSTANDING outstanding, offered ${sweep_loads[*]}${sweep_up:+ then ×1.5} q/s (at most $SWEEP_STEPS loads, $SWEEP_MINUTES min), latency"
elif [ -n "$RATE" ]; then load="at most $OUTSTANDING outstanding, $RATE QPS offered, average latency"; else load="$OUTSTANDING outstanding, QPS"; fi
loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
header=$(
	echo "# $PROTO, dnsperf $CLIENTS clients, $load, ${SECONDS_EACH}s per run, $ROUNDS rounds, $MIX names$([ -n "$CACHE" ] && echo ", peers' caches on"), $UPSTREAMS NSD upstream(s)"
	echo "# $(nproc) cores, load average $loadavg; PROXY_ENV='$PROXY_ENV'$([ -n "${BASE_BIN:-}" ] && echo " BASE_ENV='$BASE_ENV'")"
	for n in "${order[@]}"; do echo "# $n: $(version "$n") on 127.0.0.1:${target[$n]}"; done
)
echo "$header"

# measure NAME [QPS]: one dnsperf run, offering QPS queries per second if given (with -v, a line per
# answer, for the percentiles); prints dnsperfstats.awk's "qps avg_us p50_us p99_us noerror% lost%
# other" (the rate reached, latencies in microseconds, the commonest code but NOERROR), or "fail".
measure() {
	local args=(-s 127.0.0.1 -p "${target[$1]}" -m "$PROTO" -d "$QUERIES" -l "$SECONDS_EACH" -c "$CLIENTS" -q "$OUTSTANDING")
	[ -z "${2:-}" ] || args+=(-Q "$2" -v)
	dnsperf "${args[@]}" >"$work/dnsperf.out" 2>&1 || true
	awk -f "$repo/scripts/dnsperfstats.awk" "$work/dnsperf.out"
}
# failed ROUND NAME: the line saying why that run gave no figures.
failed() { echo "$1 $2 failed: $(grep -m1 -iE 'error|fatal' "$work/dnsperf.out" || tail -n 1 "$work/dnsperf.out")"; }
# median [FORMAT]: the median of the numbers on stdin (words), printed with FORMAT (%.0f); nothing
# when there are none.
median() { tr ' ' '\n' | sort -n | awk -v f="${1:-%.0f}" '$1 ~ /^[0-9.]+$/ {a[++n] = $1} END {if (n) printf f "\n", (a[int((n + 1) / 2)] + a[int(n / 2) + 1]) / 2}'; }
# ratio A B: A/B with two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }

if [ -n "$SWEEP" ]; then
	# Loads are offered in turn, the next only to the forwarders that kept up with this one.
	table=$OUT/sweep.tsv
	rm -f "$OUT/sweep.png" "$OUT/sweep.gp"   # an earlier sweep's, which this one replaces
	{
		echo "$header"
		printf 'forwarder\toffered\tachieved\tavg_us\tp50_us\tp99_us\tlost%%\tnoerror%%\n'
	} >"$table"
	active=("${order[@]}")
	started=$SECONDS step=0 load=0
	while :; do
		if [ "$step" -lt ${#sweep_loads[@]} ]; then load=${sweep_loads[$step]}
		elif [ -n "$sweep_up" ]; then load=$((load * 3 / 2))
		else break; fi
		step=$((step + 1))
		keeping=0   # forwarders keeping up that are not direct (or direct, measured alone)
		for n in "${active[@]}"; do
			if [ "$n" != direct ] || [ ${#order[@]} = 1 ]; then keeping=$((keeping + 1)); fi
		done
		if [ "$keeping" = 0 ]; then echo "# sweep: every forwarder fell behind; it ends"; break; fi
		if [ "$step" -gt "$SWEEP_STEPS" ]; then echo "# sweep: SWEEP_STEPS=$SWEEP_STEPS loads offered; it ends before $load q/s"; break; fi
		if [ $((SECONDS - started + ${#active[@]} * ROUNDS * (SECONDS_EACH + 1))) -gt $((SWEEP_MINUTES * 60)) ]; then
			echo "# sweep: $load q/s would take it past SWEEP_MINUTES=$SWEEP_MINUTES; it ends"
			break
		fi
		declare -A s_qps=() s_avg=() s_p50=() s_p99=() s_ok=() s_lost=()
		for r in $(seq 1 "$ROUNDS"); do
			for n in "${active[@]}"; do
				read -r qps avg p50 p99 ok lost other < <(measure "$n" "$load")
				if [ "$qps" = fail ] || [ "$avg" = - ]; then failed "load $load round $r" "$n"; continue; fi
				echo "load $load round $r $n qps=$qps avg_us=$avg p50_us=$p50 p99_us=$p99 noerror=$ok%${other:+ (else mostly $other)} lost=$lost%"
				s_qps[$n]+=" $qps" s_avg[$n]+=" $avg" s_p50[$n]+=" $p50" s_p99[$n]+=" $p99" s_ok[$n]+=" $ok" s_lost[$n]+=" $lost"
			done
		done
		ref=$(median <<<"${s_avg[dnsproxi]:-}")
		still=()
		for n in "${active[@]}"; do
			qps=$(median <<<"${s_qps[$n]:-}")
			if [ -z "$qps" ]; then echo "median $load $n: no run succeeded; it is not offered more"; continue; fi
			avg=$(median <<<"${s_avg[$n]}") p50=$(median <<<"${s_p50[$n]}") p99=$(median <<<"${s_p99[$n]}")
			ok=$(median %.1f <<<"${s_ok[$n]}") lost=$(median %.2f <<<"${s_lost[$n]}")
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$load" "$qps" "$avg" "${p50:--}" "${p99:--}" "$lost" "$ok" >>"$table"
			line="median $load $n qps=$qps avg_us=$avg p50_us=${p50:--} p99_us=${p99:--} noerror=$ok% lost=$lost%"
			if [ -n "$ref" ] && [ "$n" != dnsproxi ] && [ "$avg" -gt 0 ]; then line+=" dnsproxi/$n=$(ratio "$ref" "$avg")"; fi
			behind=""
			[ $((qps * 100)) -ge $((load * 95)) ] || behind+=", reached less than 95% of $load q/s"
			[ "$lost" = 0.00 ] || behind+=", lost $lost% of its queries"
			[ "${ok%.*}" -ge 99 ] || behind+=", under 99% of its answers NOERROR"
			if [ -n "$behind" ]; then line+=" (fell behind:${behind#,}; not offered more)"; else still+=("$n"); fi
			echo "$line"
		done
		active=("${still[@]}")
	done
	echo "# sweep: ${SECONDS_EACH}s runs, medians of $ROUNDS; ratio dnsproxi/peer of the average latency (below 1, dnsproxi answers sooner)"
	echo "# table: $table"
	if command -v gnuplot >/dev/null; then
		cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
		names=$(for n in "${order[@]}"; do printf ', %s %s' "$n" "$(version "$n")"; done)
		title="Latency and rate reached against offered load: ${names#, }
$(nproc) cores${cpu:+ ($cpu)}, $(date +%F), load average $(cut -d' ' -f1 <<<"$loadavg") at the start
$PROTO, dnsperf $CLIENTS clients, at most $OUTSTANDING outstanding, ${SECONDS_EACH} s per run, median of $ROUNDS rounds, $MIX names$([ -z "$CACHE" ] || echo ", the peers' caches on")$([ "$UPSTREAMS" = 1 ] || echo ", $UPSTREAMS NSD upstreams")${PROXY_ENV:+
dnsproxi with $PROXY_ENV}"
		if bash "$repo/scripts/sweepplot.sh" "$table" "$OUT/sweep.png" "$title"; then echo "# plot: $OUT/sweep.png"; fi
	fi
	exit 0
fi

if [ -n "$RATE" ]; then unit=avg_latency_us; else unit=qps; fi
# below: runs in latency mode that reached less than 95% of RATE; failing: runs with under 99% NOERROR
declare -A runs tails below failing
for r in $(seq 1 "$ROUNDS"); do
	for n in "${order[@]}"; do
		read -r qps avg p50 p99 ok lost other < <(measure "$n" "$RATE")
		if [ "$qps" = fail ] || { [ -n "$RATE" ] && [ "$avg" = - ]; }; then failed "round $r" "$n"; continue; fi
		if [ -n "$RATE" ]; then v=$avg v_line="$unit=$avg p99_us=$p99 qps=$qps"; else v=$qps v_line="$unit=$qps"; fi
		echo "round $r $n $v_line noerror=$ok%${other:+ (else mostly $other)} lost=$lost%"
		runs[$n]="${runs[$n]:-} $v" tails[$n]="${tails[$n]:-} $p99"
		if [ -n "$RATE" ] && [ $((qps * 100)) -lt $((RATE * 95)) ]; then below[$n]=$((${below[$n]:-0} + 1)); fi
		if [ "${ok%.*}" -lt 99 ]; then failing[$n]=$((${failing[$n]:-0} + 1)); fi
	done
done

echo "# median of $ROUNDS; ratio dnsproxi/peer ($([ -n "$RATE" ] && echo "latency: below 1, dnsproxi answers sooner" || echo "QPS: above 1, dnsproxi is faster"))"
ref=$(median <<<"${runs[dnsproxi]:-}")
for n in "${order[@]}"; do
	m=$(median <<<"${runs[$n]:-}")
	[ -n "$m" ] || { echo "median $n: no run succeeded"; continue; }
	line="median $n $unit=$m"
	[ -z "$RATE" ] || line+=" p99_us=$(median <<<"${tails[$n]}")"
	if [ -n "$ref" ] && [ "$n" != dnsproxi ] && [ "$m" -gt 0 ]; then
		line+=" dnsproxi/$n=$(ratio "$ref" "$m")"
	fi
	[ -z "${below[$n]:-}" ] || line+=" (in ${below[$n]} runs it reached less than 95% of $RATE QPS)"
	[ -z "${failing[$n]:-}" ] || line+=" (in ${failing[$n]} runs under 99% of its answers were NOERROR)"
	echo "$line"
done
