// Package freeport hands tests loopback TCP ports to configure servers
// that must know their ports before they start (clustered NATS routes,
// kube-apiserver flags).
//
// A port taken with Listen("127.0.0.1:0") and closed comes from the
// kernel's ephemeral range, the same range every outbound connection
// draws its source port from, so under load another connection can take
// it before the server binds it ("address already in use"). Ports here
// come from outside that range, where only explicit binds can land, and
// a port is never handed out twice by one process.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

var (
	mu     sync.Mutex
	issued = map[int]bool{}
)

// Ports returns n distinct loopback TCP ports that were free a moment ago
// and lie outside the ephemeral range.
func Ports(n int) ([]int, error) {
	lo, hi := span()
	mu.Lock()
	defer mu.Unlock()
	out := make([]int, 0, n)
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("freeport: no free loopback port in %d-%d after %d tries", lo, hi, tries)
		}
		p := lo + rand.IntN(hi-lo)
		if issued[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		issued[p] = true
		out = append(out, p)
	}
	return out, nil
}

// Port is Ports(1).
func Port() (int, error) {
	p, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// span is the widest stretch of unprivileged ports outside the kernel's
// ephemeral range (Linux default 32768-60999, so 10000-32767).
func span() (lo, hi int) {
	elo, ehi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			a, err1 := strconv.Atoi(f[0])
			z, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && a <= z {
				elo, ehi = a, z
			}
		}
	}
	below := [2]int{10000, elo}
	above := [2]int{ehi + 1, 65536}
	if below[1]-below[0] >= above[1]-above[0] {
		return below[0], below[1]
	}
	return above[0], above[1]
}
