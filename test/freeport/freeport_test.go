package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPortsAreDistinctBindableAndOutsideEphemeral(t *testing.T) {
	lo, hi := span()
	if hi-lo < 1000 {
		t.Fatalf("span %d-%d too small", lo, hi)
	}
	ports, err := Ports(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < lo || p >= hi {
			t.Fatalf("port %d outside %d-%d", p, lo, hi)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		ln.Close()
	}
	more, err := Ports(5)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		if seen[p] {
			t.Fatalf("port %d handed out again in a later call", p)
		}
	}
}
