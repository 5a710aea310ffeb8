GO ?= go

.PHONY: run test bench build vet

# run starts the proxy on 127.0.0.1:5398. Set DNS_UPSTREAM to your resolver.
run:
	$(GO) run .

build:
	$(GO) build -o dnsproxi .

test:
	$(GO) test -race ./...

vet:
	gofmt -l . | (! grep .) && $(GO) vet ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./guard/
