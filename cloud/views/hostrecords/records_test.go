package hostrecords

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func grid(name, key, svc string) appsv1alpha1.StatefulSetGrid {
	g := appsv1alpha1.StatefulSetGrid{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	g.Spec.GridUniqKey = key
	g.Spec.Template.ServiceName = svc
	return g
}

// gridPod is pod <grid>-<unit>-<i> of the StatefulSet <grid>-<unit>, as
// the StatefulSet controller makes it.
func gridPod(g, unit string, i int, ip string) corev1.Pod {
	set := g + "-" + unit
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%d", set, i), Namespace: "default",
			Labels: map[string]string{wellknown.LabelGrid: g, wellknown.LabelGridUnit: unit},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "StatefulSet", Name: set, UID: "u", Controller: ptr.To(true),
			}},
		},
		Spec:   corev1.PodSpec{Hostname: fmt.Sprintf("%s-%d", set, i), Subdomain: "db-svc"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
}

func with(p corev1.Pod, f func(*corev1.Pod)) corev1.Pod { f(&p); return p }

// render is the records of every unit as "unit: ip names; ip names".
func render(res Result) string {
	var b strings.Builder
	for _, u := range []string{"u1", "u2", "u3"} {
		r := res.Units[u]
		if r == nil {
			continue
		}
		if r.GetUnit() != u || r.GetFingerprint() != Fingerprint(r) {
			return fmt.Sprintf("unit %s: bad record set %v", u, r)
		}
		fmt.Fprintf(&b, "%s:", u)
		for _, rec := range r.GetRecords() {
			fmt.Fprintf(&b, " %s %s;", rec.GetIp(), strings.Join(rec.GetHostnames(), ","))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestCompute(t *testing.T) {
	db := grid("db", "", "db-svc")
	tests := []struct {
		name    string
		grids   []appsv1alpha1.StatefulSetGrid
		pods    []corev1.Pod
		domain  string
		want    string
		skipped map[string]int
	}{
		{
			name:  "each unit maps the names to its own pods",
			grids: []appsv1alpha1.StatefulSetGrid{db},
			pods: []corev1.Pod{
				gridPod("db", "u1", 0, "10.1.0.1"), gridPod("db", "u1", 1, "10.1.0.2"),
				gridPod("db", "u2", 0, "10.2.0.1"),
			},
			domain: "cluster.local",
			want: "u1: 10.1.0.1 db-0.db-svc.default.svc.cluster.local; 10.1.0.2 db-1.db-svc.default.svc.cluster.local;\n" +
				"u2: 10.2.0.1 db-0.db-svc.default.svc.cluster.local;\n",
		},
		{
			name:   "no cluster domain: names end in .svc; records sorted by IP",
			grids:  []appsv1alpha1.StatefulSetGrid{db},
			pods:   []corev1.Pod{gridPod("db", "u1", 1, "10.1.0.9"), gridPod("db", "u1", 0, "10.1.0.10")},
			domain: "",
			want:   "u1: 10.1.0.10 db-0.db-svc.default.svc; 10.1.0.9 db-1.db-svc.default.svc;\n",
		},
		{
			name:  "pods without IP, finished or being deleted have no record",
			grids: []appsv1alpha1.StatefulSetGrid{db},
			pods: []corev1.Pod{
				gridPod("db", "u1", 0, ""),
				with(gridPod("db", "u1", 1, "10.1.0.2"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
				with(gridPod("db", "u1", 2, "10.1.0.3"), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }),
				gridPod("db", "u1", 3, "10.1.0.4"),
			},
			domain: "cluster.local",
			want:   "u1: 10.1.0.4 db-3.db-svc.default.svc.cluster.local;\n",
		},
		{
			name:   "a pod whose grid is gone has no record",
			grids:  nil,
			pods:   []corev1.Pod{gridPod("db", "u1", 0, "10.1.0.1")},
			domain: "cluster.local",
			want:   "",
		},
		{
			name:  "a grid keyed on another label has no records",
			grids: []appsv1alpha1.StatefulSetGrid{grid("db", "zone", "db-svc")},
			pods:  []corev1.Pod{gridPod("db", "u1", 0, "10.1.0.1")},
			want:  "", skipped: map[string]int{SkipGridKey: 1},
		},
		{
			name:  "pods not of the unit's StatefulSet are left out",
			grids: []appsv1alpha1.StatefulSetGrid{db},
			pods: []corev1.Pod{
				// a Deployment's pod of a grid of the same name
				with(gridPod("db", "u1", 0, "10.1.0.1"), func(p *corev1.Pod) { p.Name = "db-u1-5d8f7-abcde" }),
				with(gridPod("db", "u1", 1, "10.1.0.2"), func(p *corev1.Pod) { p.OwnerReferences[0].Kind = "ReplicaSet" }),
				with(gridPod("db", "u1", 2, "10.1.0.3"), func(p *corev1.Pod) { p.OwnerReferences = nil }),
				with(gridPod("db", "u1", 3, "10.1.0.4"), func(p *corev1.Pod) { p.Labels[wellknown.LabelGridUnit] = "u2" }),
				with(gridPod("db", "u1", 4, "10.1.0.5"), func(p *corev1.Pod) { p.Name = "db-u1-04" }),
				gridPod("db", "u1", 5, "10.1.0.6"),
			},
			domain: "cluster.local",
			want:   "u1: 10.1.0.6 db-5.db-svc.default.svc.cluster.local;\n", skipped: map[string]int{SkipNotOwned: 5},
		},
		{
			name:  "the grid template's serviceName when the pod has no subdomain; none: left out",
			grids: []appsv1alpha1.StatefulSetGrid{db, grid("cache", "atoll.io/unit", "")},
			pods: []corev1.Pod{
				with(gridPod("db", "u1", 0, "10.1.0.1"), func(p *corev1.Pod) { p.Spec.Subdomain = "" }),
				with(gridPod("cache", "u1", 0, "10.1.0.2"), func(p *corev1.Pod) { p.Spec.Subdomain = "" }),
			},
			domain: "cluster.local",
			want:   "u1: 10.1.0.1 db-0.db-svc.default.svc.cluster.local;\n", skipped: map[string]int{SkipNoService: 1},
		},
		{
			name:   "two grids' pods on one IP (host network) share a line",
			grids:  []appsv1alpha1.StatefulSetGrid{db, grid("cache", "", "c")},
			pods:   []corev1.Pod{gridPod("db", "u1", 0, "10.1.0.1"), with(gridPod("cache", "u1", 0, "10.1.0.1"), func(p *corev1.Pod) { p.Spec.Subdomain = "c" })},
			domain: "example.org",
			want:   "u1: 10.1.0.1 cache-0.c.default.svc.example.org,db-0.db-svc.default.svc.example.org;\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Compute(tt.grids, tt.pods, wellknown.LabelUnit, tt.domain)
			if got := render(res); got != tt.want {
				t.Fatalf("records\n%s\nwant\n%s", got, tt.want)
			}
			for _, reason := range []string{SkipGridKey, SkipNotOwned, SkipNoService} {
				if res.Skipped[reason] != tt.skipped[reason] {
					t.Errorf("skipped %s = %d, want %d", reason, res.Skipped[reason], tt.skipped[reason])
				}
			}
		})
	}
}

// TestFingerprint: equal sets hash equal whatever their time or stored
// fingerprint; any change of unit, IP or name changes the hash.
func TestFingerprint(t *testing.T) {
	base := &atollv1.HostRecords{Unit: "u1", Records: []*atollv1.HostRecord{{Ip: "10.0.0.1", Hostnames: []string{"a.svc"}}}}
	same := &atollv1.HostRecords{Unit: "u1", Fingerprint: "x", Records: []*atollv1.HostRecord{{Ip: "10.0.0.1", Hostnames: []string{"a.svc"}}}}
	if Fingerprint(base) != Fingerprint(same) {
		t.Fatal("equal record sets hash differently")
	}
	for _, other := range []*atollv1.HostRecords{
		{Unit: "u2", Records: base.Records},
		{Unit: "u1", Records: []*atollv1.HostRecord{{Ip: "10.0.0.2", Hostnames: []string{"a.svc"}}}},
		{Unit: "u1", Records: []*atollv1.HostRecord{{Ip: "10.0.0.1", Hostnames: []string{"b.svc"}}}},
		{Unit: "u1"},
	} {
		if Fingerprint(other) == Fingerprint(base) {
			t.Errorf("%v hashes like %v", other, base)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(*Config) {}, ""},
		{func(c *Config) { c.ClusterDomain = "" }, ""},
		{func(c *Config) { c.ClusterDomain = ".cluster.local" }, "ClusterDomain"},
		{func(c *Config) { c.Units.Label = "" }, "unit label"},
		{func(c *Config) { c.Resync = 0 }, "Resync"},
		{func(c *Config) { c.Debounce = -1 }, "Debounce"},
	} {
		c := DefaultConfig()
		tt.mut(&c)
		err := c.Validate()
		if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("Validate() = %v, want an error naming %q", err, tt.want)
		}
	}
}
