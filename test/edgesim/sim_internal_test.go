package edgesim

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestNodeIP(t *testing.T) {
	tests := []struct {
		index   int
		want    string
		wantErr bool
	}{
		{index: 0, want: "172.16.0.1"},
		{index: 254, want: "172.16.0.255"},
		{index: 255, want: "172.16.1.0"},
		{index: 65535, want: "172.17.0.0"},
		{index: maxNodeIndex - 1, want: "172.31.255.254"},
		{index: maxNodeIndex, wantErr: true},
		{index: -1, wantErr: true},
	}
	for _, tt := range tests {
		got, err := nodeIP(tt.index)
		if tt.wantErr {
			if err == nil {
				t.Errorf("nodeIP(%d) = %s, want error", tt.index, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("nodeIP(%d) = %s, %v; want %s", tt.index, got, err, tt.want)
		}
	}
}

func TestPodCIDR(t *testing.T) {
	tests := []struct {
		index   int
		want    string
		wantErr bool
	}{
		{index: 0, want: "10.64.0.0/24"},
		{index: 1, want: "10.64.1.0/24"},
		{index: 256, want: "10.65.0.0/24"},
		{index: maxCIDRIndex - 1, want: "10.127.255.0/24"},
		{index: maxCIDRIndex, wantErr: true},
	}
	for _, tt := range tests {
		got, err := podCIDR(tt.index)
		if tt.wantErr {
			if err == nil {
				t.Errorf("podCIDR(%d) = %s, want error", tt.index, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("podCIDR(%d) = %s, %v; want %s", tt.index, got, err, tt.want)
		}
	}
}

func TestIPPool(t *testing.T) {
	p := newIPPool(netip.MustParsePrefix("10.64.3.0/24"))
	first, err := p.next()
	if err != nil || first.String() != "10.64.3.2" {
		t.Fatalf("first = %s, %v; want 10.64.3.2", first, err)
	}
	if !p.claim(netip.MustParseAddr("10.64.3.3")) {
		t.Fatal("claim of a free address failed")
	}
	for _, ip := range []string{"10.64.3.3", "10.64.3.1", "10.64.3.255", "10.64.4.5"} {
		if p.claim(netip.MustParseAddr(ip)) {
			t.Errorf("claim(%s) succeeded, want refused (taken or not a host address)", ip)
		}
	}
	if got, _ := p.next(); got.String() != "10.64.3.4" {
		t.Errorf("next after claim = %s, want 10.64.3.4", got)
	}
	p.release(first)
	if got, _ := p.next(); got != first {
		t.Errorf("next after release = %s, want %s again", got, first)
	}
	for {
		if _, err := p.next(); err != nil {
			if !errors.Is(err, errPodCIDRFull) {
				t.Fatalf("exhausted pool: %v, want errPodCIDRFull", err)
			}
			break
		}
	}
	if len(p.used) != 253 {
		t.Errorf("%d addresses handed out, want 253 (.2–.254)", len(p.used))
	}
}

func TestNodeSpecResolved(t *testing.T) {
	tests := []struct {
		name     string
		spec     NodeSpec
		wantIP   string
		wantCIDR string
		wantErr  string
	}{
		{name: "defaults", spec: NodeSpec{Name: "edge-1"}, wantIP: "172.16.0.8", wantCIDR: "10.64.7.0/24"},
		{name: "explicit", spec: NodeSpec{Name: "edge-1", InternalIP: "192.168.7.10", PodCIDR: "10.1.2.3/24"}, wantIP: "192.168.7.10", wantCIDR: "10.1.2.0/24"},
		{name: "bad name", spec: NodeSpec{Name: "Edge_1"}, wantErr: "node name"},
		{name: "bad ip", spec: NodeSpec{Name: "edge-1", InternalIP: "fd00::1"}, wantErr: "InternalIP"},
		{name: "bad cidr", spec: NodeSpec{Name: "edge-1", PodCIDR: "10.1.0.0/16"}, wantErr: "PodCIDR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ip, cidr, err := tt.spec.resolved(7)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ip.String() != tt.wantIP || cidr.String() != tt.wantCIDR || got.InternalIP != tt.wantIP || got.PodCIDR != tt.wantCIDR {
				t.Errorf("resolved = %s %s (%s %s), want %s %s", ip, cidr, got.InternalIP, got.PodCIDR, tt.wantIP, tt.wantCIDR)
			}
			if got.CPU.String() != "4" || got.Memory.String() != "8Gi" || got.Pods.String() != "110" {
				t.Errorf("capacity = %s/%s/%s, want defaults 4/8Gi/110", &got.CPU, &got.Memory, &got.Pods)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "defaults", cfg: Config{}},
		{name: "negative renew", cfg: Config{RenewInterval: -time.Second}, wantErr: "RenewInterval"},
		{name: "short lease", cfg: Config{LeaseDuration: time.Millisecond}, wantErr: "LeaseDuration"},
		{name: "no workers", cfg: Config{Workers: -1}, wantErr: "Workers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.withDefaults().Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}
