GO ?= go

.PHONY: run build test vet bench compare drill fuzz overload

# run starts the proxy on 127.0.0.1:5398. DNS_UPSTREAM defaults to the first
# nameserver of /etc/resolv.conf; set it to choose another upstream.
run:
	$(GO) run .

# build stamps the binary with its commit (dnsproxi -version), even where
# GOFLAGS says -buildvcs=false.
build:
	$(GO) build -buildvcs=auto -o dnsproxi .

test:
	$(GO) test -race ./...

vet:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...

# bench runs the guard benchmarks (beside x/time/rate and gobreaker), choosing
# an upstream (pool), the fleet limiter's Allow (beside the local bucket), the
# answer cache's hits and stores (beside a map) and the whole UDP path; make
# compare measures the whole proxy beside its peers.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./guard/
	$(GO) test -run '^$$' -bench . -benchmem ./pool/
	$(GO) test -run '^$$' -bench . -benchmem ./cache/
	$(GO) test -run '^$$' -bench . -benchmem ./fleet/
	$(GO) test -run '^$$' -bench UDPPath -benchmem -benchtime 3s .

# compare builds dnsproxi and runs it side by side with dnsdist, CoreDNS, Unbound
# and dnsmasq (those installed, or PEERS) in front of a local NSD, under dnsperf;
# make compare HELP=1 lists its variables (PEERS, ROUNDS, RATE, BASE_BIN, ...);
# make compare SWEEP=1 OUT=dir sweeps the offered load from 1k q/s upwards and
# draws latency and rate reached against it (dir/sweep.png, from dir/sweep.tsv).
compare:
	@GO='$(GO)' bash scripts/compare.sh $(if $(HELP),-h)

# drill runs every live drill at the chapter's timings (a few minutes; the
# quick form, which make test runs, takes about one).
drill:
	$(GO) run ./exercises/drill all

# fuzz runs each of the five fuzz targets for FUZZTIME (30 s): about 2 min 50 s
# in all on 2 cores, of which building the instrumented tests takes some 15 s
# with a warm build cache. make test replays their seed corpus. A run that ends
# with Go's "context deadline exceeded" and no failing input found nothing
# (scripts/fuzz.sh).
FUZZTIME ?= 30s
fuzz:
	@GO='$(GO)' bash scripts/fuzz.sh . FuzzServePacket $(FUZZTIME)
	@GO='$(GO)' bash scripts/fuzz.sh . FuzzUpstreamReply $(FUZZTIME)
	@GO='$(GO)' bash scripts/fuzz.sh . FuzzRateLimit $(FUZZTIME)
	@GO='$(GO)' bash scripts/fuzz.sh . FuzzConfigAddresses $(FUZZTIME)
	@GO='$(GO)' bash scripts/fuzz.sh ./cache FuzzStore $(FUZZTIME)

# overload floods a blackholed upstream at 3000 QPS for 15 s, in three configurations.
overload:
	$(GO) run ./exercises/drill blackhole-flood
