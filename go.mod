module dnsproxi

go 1.26.0

require (
	github.com/sony/gobreaker/v2 v2.4.0
	golang.org/x/time v0.16.0
)
