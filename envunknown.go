package main

import (
	"reflect"
	"regexp"
	"strings"
)

// Kubernetes puts variables in every pod for each service of its namespace:
// for a service named "dns" or "dns-cache", DNS_SERVICE_HOST or
// DNS_CACHE_SERVICE_HOST, DNS_SERVICE_PORT(_<port name>), DNS_PORT and
// DNS_PORT_53_UDP (a URL: udp://10.0.0.10:53), DNS_PORT_53_UDP_PROTO,
// _PORT and _ADDR. None is ours. kubernetesService matches the names only
// a service's can have; kubernetesPort, DNS_<...>_PORT, is one only with a
// URL for its value, else it is a misspelled setting (DNS_LISTEN_PORT=5353).
var (
	kubernetesService = regexp.MustCompile(`^DNS_(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$`)
	kubernetesPort    = regexp.MustCompile(`^DNS_(\w+_)?PORT=(tcp|udp|sctp)://`)
)

// fromKubernetes reports whether kv ("KEY=value") is one of the variables
// Kubernetes gives a pod for a service.
func fromKubernetes(name, kv string) bool {
	return kubernetesService.MatchString(name) || kubernetesPort.MatchString(kv)
}

// unknownVariables returns the DNS_ variables in environ ("KEY=value"
// lines) that name no setting, each with the setting whose name is nearest
// if one is a few letters away, else "". Without this a misspelled
// variable (DNS_BREAKER_TRESHOLD=50) leaves its setting at the default,
// the breaker off, and nothing says so
// (TestAttackMisspelledVariableGoesUnnoticed). They are warned about, not
// refused: a name that is not ours may be another program's.
func unknownVariables(environ []string) [][2]string {
	known := map[string]bool{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		if tag := t.Field(i).Tag.Get("envconfig"); tag != "" {
			known["DNS_"+tag] = true
		}
	}
	var out [][2]string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "DNS_") || known[name] || fromKubernetes(name, kv) {
			continue
		}
		best, bestDist := "", 4 // at most 3 edits away
		for k := range known {
			if d := editDistance(name, k); d < bestDist || d == bestDist && k < best {
				best, bestDist = k, d
			}
		}
		out = append(out, [2]string{name, best})
	}
	return out
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
