package enroll_test

import (
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/edge/enroll"
)

// TestAllowsBallot: credentials issued today let the node publish its
// ballot; credentials from before ballots (probe reports and votes only)
// do not, so the enroller renews them at once; credentials of no unit have
// no ballot to send.
func TestAllowsBallot(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	claims := func(unit string, perms jwt.Permissions) *jwt.UserClaims {
		c := jwt.NewUserClaims(pub)
		c.Permissions = perms
		if unit != "" {
			c.Tags.Add("unit:" + unit)
		}
		return c
	}
	// What cloud/identity.EdgePermissions grants today, in part.
	var now jwt.Permissions
	now.Pub.Allow.Add("atoll.health.ballot.site-a.edge-1", "atoll.topo.node.edge-1")
	var old jwt.Permissions
	old.Pub.Allow.Add("atoll.health.probe.site-a.edge-1", "atoll.health.vote.site-a.*.edge-1", "atoll.topo.node.edge-1")
	tests := []struct {
		name string
		c    *jwt.UserClaims
		want bool
	}{
		{"current credentials", claims("site-a", now), true},
		{"credentials from before ballots", claims("site-a", old), false},
		{"no unit", claims("", old), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := enroll.AllowsBallot(tt.c, "edge-1"); got != tt.want {
				t.Fatalf("AllowsBallot = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestHearsRepublishedViews: credentials issued today let the node hear
// its assignment where the hub republishes it; credentials from before the
// republished views do not, so the enroller renews them at once.
func TestHearsRepublishedViews(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	claims := func(sub ...string) *jwt.UserClaims {
		c := jwt.NewUserClaims(pub)
		c.Tags.Add("unit:site-a")
		c.Sub.Allow.Add(sub...)
		return c
	}
	tests := []struct {
		name string
		c    *jwt.UserClaims
		want bool
	}{
		// What cloud/identity.EdgePermissions grants today, in part.
		{"current credentials", claims("atoll.view._.assignment._.edge-1", "atoll.viewpub._.assignment._.edge-1", "atoll.viewpub.site-a.>"), true},
		{"credentials from before the republished views", claims("atoll.view._.assignment._.edge-1", "atoll.view.site-a.>"), false},
		{"another node's", claims("atoll.viewpub._.assignment._.edge-2"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := enroll.HearsRepublishedViews(tt.c, "edge-1"); got != tt.want {
				t.Fatalf("HearsRepublishedViews = %v, want %v", got, tt.want)
			}
		})
	}
}
