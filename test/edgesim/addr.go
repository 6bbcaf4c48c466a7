package edgesim

import (
	"errors"
	"fmt"
	"net/netip"
)

// Address plan for nodes that do not bring their own addresses; both are
// derived from the registration index so a run is reproducible.
const (
	maxNodeIndex = 1<<20 - 2 // 172.16.0.0/12 minus network and broadcast
	maxCIDRIndex = 1 << 14   // 10.64.0.0/10 holds 2^14 /24s
)

// nodeIP is the i-th address in 172.16.0.0/12, skipping the network address.
func nodeIP(i int) (netip.Addr, error) {
	if i < 0 || i >= maxNodeIndex {
		return netip.Addr{}, fmt.Errorf("node index %d: no default InternalIP past %d nodes", i, maxNodeIndex)
	}
	n := i + 1
	return netip.AddrFrom4([4]byte{172, byte(16 + n>>16), byte(n >> 8), byte(n)}), nil
}

// podCIDR is the i-th /24 in 10.64.0.0/10.
func podCIDR(i int) (netip.Prefix, error) {
	if i < 0 || i >= maxCIDRIndex {
		return netip.Prefix{}, fmt.Errorf("node index %d: no default PodCIDR past %d nodes", i, maxCIDRIndex)
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + i>>8), byte(i), 0}), 24), nil
}

// errPodCIDRFull means a node has no pod IP left to hand out.
var errPodCIDRFull = errors.New("pod CIDR exhausted")

// ipPool hands out the host addresses .2–.254 of a /24 (.1 is the node's
// bridge by convention). It is not safe for concurrent use.
type ipPool struct {
	cidr netip.Prefix
	used map[netip.Addr]bool
}

func newIPPool(cidr netip.Prefix) *ipPool {
	return &ipPool{cidr: cidr, used: map[netip.Addr]bool{}}
}

// claim marks ip as used if it belongs to the pool and is free.
func (p *ipPool) claim(ip netip.Addr) bool {
	if !p.usable(ip) || p.used[ip] {
		return false
	}
	p.used[ip] = true
	return true
}

// next returns the lowest free address.
func (p *ipPool) next() (netip.Addr, error) {
	for ip := p.cidr.Addr().Next().Next(); p.usable(ip); ip = ip.Next() {
		if !p.used[ip] {
			p.used[ip] = true
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: %s", errPodCIDRFull, p.cidr)
}

func (p *ipPool) release(ip netip.Addr) { delete(p.used, ip) }

// usable reports whether ip is one of the pool's host addresses.
func (p *ipPool) usable(ip netip.Addr) bool {
	if !p.cidr.Contains(ip) {
		return false
	}
	last := ip.As4()[3]
	return last >= 2 && last <= 254
}
