// Package hostrecords publishes the StatefulSetGrid DNS records of each
// unit on the hub's VIEWS stream (atoll.view.<unit>.hosts._.<unit>,
// atoll.v1.HostRecords, the unit's full set each time), for the edge hosts
// writers (edge/hosts) that keep CoreDNS hosts files from them.
//
// In unit U, `<ssg>-<i>.<svc>.<ns>.svc.<cluster-domain>` names the pod
// `<ssg>-<U>-<i>` of the StatefulSet `<ssg>-<U>` that the StatefulSetGrid
// <ssg> runs in U: the same name reaches the same ordinal of the unit's
// own copy in every unit, as SuperEdge's StatefulSetGrid DNS does.
//
// Publication follows the rules of the unit and object views
// (cloud/views/members, cloud/views/objects): a unit's records are published
// only when the stream's last value on its subject has another
// fingerprint, with message id <subject>@<fingerprint>@<sequence it
// replaces> and the expected last subject sequence, so replicas run
// active-active and a pass that changes nothing stores nothing.
package hostrecords

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Reasons a grid or pod gives no record (Result.Skipped).
const (
	// SkipGridKey: the grid's gridUniqKey is not the unit label, so its
	// units are not atoll units (no subject to publish them on).
	SkipGridKey = "grid_key"
	// SkipNotOwned: the pod carries the grid's labels but is not a pod of
	// the grid's StatefulSet in its unit (owner or name do not match).
	SkipNotOwned = "not_owned"
	// SkipNoService: neither the pod's subdomain nor the grid's template
	// names a Service.
	SkipNoService = "no_service"
)

// Result is what Compute found.
type Result struct {
	// Units maps each unit to its records (units without any are absent).
	Units map[string]*atollv1.HostRecords
	// Skipped counts the grids and pods left out, by reason.
	Skipped map[string]int
}

// Compute returns the host records of every unit: for each
// StatefulSetGrid whose gridUniqKey is unitLabel, each of its pods that
// has an IP and is not finished or being deleted maps
// `<ssg>-<i>.<svc>.<ns>.svc[.<clusterDomain>]` to its IP in the pod's
// unit. The pod must be `<ssg>-<unit>-<i>`, controlled by the StatefulSet
// `<ssg>-<unit>`, labeled with the grid and unit (as cloud/grid makes
// them); <svc> is its subdomain (the StatefulSet's serviceName), else the
// grid template's serviceName. An empty clusterDomain leaves the names
// ending in ".svc" (the edge writer then completes them). Records are
// sorted by IP, hostnames sorted.
func Compute(grids []appsv1alpha1.StatefulSetGrid, pods []corev1.Pod, unitLabel, clusterDomain string) Result {
	res := Result{Units: map[string]*atollv1.HostRecords{}, Skipped: map[string]int{}}
	type gridKey struct{ namespace, name string }
	byGrid := map[gridKey]*appsv1alpha1.StatefulSetGrid{}
	for i := range grids {
		g := &grids[i]
		key := g.Spec.GridUniqKey
		if key == "" {
			key = wellknown.LabelUnit
		}
		if key != unitLabel {
			res.Skipped[SkipGridKey]++
			continue
		}
		byGrid[gridKey{g.Namespace, g.Name}] = g
	}
	ips := map[string]map[string][]string{} // unit → ip → hostnames
	for i := range pods {
		p := &pods[i]
		g := byGrid[gridKey{p.Namespace, p.Labels[wellknown.LabelGrid]}]
		if g == nil {
			continue // not a StatefulSetGrid's pod (or its grid is skipped)
		}
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		unit := p.Labels[wellknown.LabelGridUnit]
		ordinal, ok := ordinalOf(p, g.Name, unit)
		if !ok {
			res.Skipped[SkipNotOwned]++
			continue
		}
		svc := p.Spec.Subdomain
		if svc == "" {
			svc = g.Spec.Template.ServiceName
		}
		if svc == "" {
			res.Skipped[SkipNoService]++
			continue
		}
		name := fmt.Sprintf("%s-%d.%s.%s.svc", g.Name, ordinal, svc, p.Namespace)
		if clusterDomain != "" {
			name += "." + clusterDomain
		}
		if ips[unit] == nil {
			ips[unit] = map[string][]string{}
		}
		if !slices.Contains(ips[unit][p.Status.PodIP], name) {
			ips[unit][p.Status.PodIP] = append(ips[unit][p.Status.PodIP], name)
		}
	}
	for unit, byIP := range ips {
		recs := &atollv1.HostRecords{Unit: unit}
		for _, ip := range slices.Sorted(maps.Keys(byIP)) {
			names := byIP[ip]
			slices.Sort(names)
			recs.Records = append(recs.Records, &atollv1.HostRecord{Ip: ip, Hostnames: names})
		}
		recs.Fingerprint = Fingerprint(recs)
		res.Units[unit] = recs
	}
	return res
}

// ordinalOf is the ordinal of p as a pod of grid in unit: its name is
// `<grid>-<unit>-<ordinal>` and the StatefulSet `<grid>-<unit>` controls it.
func ordinalOf(p *corev1.Pod, grid, unit string) (int, bool) {
	if unit == "" {
		return 0, false
	}
	set := grid + "-" + unit
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "StatefulSet" || ref.Name != set {
		return 0, false
	}
	rest, ok := strings.CutPrefix(p.Name, set+"-")
	if !ok || rest == "" || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return 0, false
	}
	return n, true
}

// Fingerprint is the hash of recs' unit and records (not of its time or
// fingerprint fields): equal record sets have equal fingerprints.
func Fingerprint(recs *atollv1.HostRecords) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&atollv1.HostRecords{Unit: recs.GetUnit(), Records: recs.GetRecords()})
	if err != nil { // cannot happen for these messages
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
