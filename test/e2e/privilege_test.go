package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/testbed"
)

// grant is one permission: a verb on a resource (group/resource[/sub]),
// in a namespace ("" for a ClusterRole) and on a name ("" for any).
type grant struct {
	verb, group, resource, namespace, name string
}

func (g grant) String() string {
	s := g.verb + " " + g.resource
	if g.group != "" {
		s = g.verb + " " + g.resource + "." + g.group
	}
	if g.namespace != "" {
		s += " in " + g.namespace
	}
	if g.name != "" {
		s += " named " + g.name
	}
	return s
}

// covers reports whether the grant allows request r.
func (g grant) covers(r grant) bool {
	return g.verb == r.verb && g.group == r.group && g.resource == r.resource &&
		(g.namespace == "" || g.namespace == r.namespace) && (g.name == "" || g.name == r.name)
}

// manifestGrants lists every permission deploy/base/atoll-cloud.yaml gives
// atoll-cloud's ServiceAccount: the rules of the roles bound to it, one
// grant per verb, resource and name.
func manifestGrants(t *testing.T) []grant {
	t.Helper()
	data, err := deploy.Read(testbed.CloudManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeManifests(testbed.CloudManifest, data)
	if err != nil {
		t.Fatal(err)
	}
	type role struct{ kind, namespace, name string } // namespace "" for a ClusterRole
	rules := map[role][]rbacv1.PolicyRule{}
	var bound []role
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole", "Role":
			var r rbacv1.Role // same rules field
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			rules[role{o.GetKind(), o.GetNamespace(), o.GetName()}] = r.Rules
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == testbed.CloudNamespace && s.Name == testbed.CloudServiceAccount
			}) {
				continue
			}
			ns := ""
			if b.RoleRef.Kind == "Role" {
				ns = o.GetNamespace()
			}
			bound = append(bound, role{b.RoleRef.Kind, ns, b.RoleRef.Name})
		}
	}
	var out []grant
	for _, ref := range bound {
		rs, ok := rules[ref]
		if !ok {
			t.Fatalf("%s binds %s, which it does not define", testbed.CloudManifest, ref)
		}
		ns := ref.namespace
		for _, r := range rs {
			names := r.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						for _, n := range names {
							out = append(out, grant{verb: v, group: g, resource: res, namespace: ns, name: n})
						}
					}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s grants the ServiceAccount nothing", testbed.CloudManifest)
	}
	return out
}

// used collects, over the e2e tests that ran atoll-cloud as its
// ServiceAccount, how often it used each grant of the manifest.
var used = struct {
	sync.Mutex
	grants map[grant]int
	tests  map[string]bool
}{grants: map[grant]int{}, tests: map[string]bool{}}

// checkLeastPrivilege reads the apiserver's audit log of every request
// atoll-cloud's ServiceAccount made during test t: nothing it asked for
// may have been refused, and atoll-cloud's log must mention no refusal.
// What it used is added to used, for TestLeastPrivilege.
func (e *env) checkLeastPrivilege(t *testing.T) {
	t.Helper()
	events, err := kubetest.ReadAudit(kubetest.AuditLog(e.auditDir))
	if err != nil {
		t.Fatal(err)
	}
	grants := manifestGrants(t)
	var denied []string
	used.Lock()
	defer used.Unlock()
	for _, ev := range events {
		if ev.User.Username != testbed.CloudUser || ev.ObjectRef.Resource == "" {
			continue
		}
		res := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			res += "/" + ev.ObjectRef.Subresource
		}
		r := grant{verb: ev.Verb, group: ev.ObjectRef.APIGroup, resource: res, namespace: ev.ObjectRef.Namespace, name: ev.ObjectRef.Name}
		if ev.ResponseStatus.Code == 403 {
			denied = append(denied, r.String())
			continue
		}
		for _, g := range grants {
			if g.covers(r) {
				used.grants[g]++
			}
		}
	}
	slices.Sort(denied)
	for _, d := range slices.Compact(denied) {
		t.Errorf("atoll-cloud's ServiceAccount was refused: %s (deploy/%s grants too little)", d, testbed.CloudManifest)
	}
	for _, line := range forbiddenLines(t, e.logPath) {
		t.Errorf("atoll-cloud logged a refusal: %s", line)
	}
	if !t.Failed() {
		used.tests[strings.SplitN(t.Name(), "/", 2)[0]] = true
	}
}

// notInE2E are grants the e2e scenarios cannot be relied on to use, each
// with the code that needs it and the test that exercises that code.
var notInE2E = map[grant]string{
	{verb: "get", group: "", resource: "endpoints"}: "cloud/health/patch.go re-reads an object whose patch conflicted " +
		"(exercised with nodes in every e2e run, with endpoints only when a conflict happens)",
	{verb: "get", group: "discovery.k8s.io", resource: "endpointslices"}: "as get endpoints",
	// The informers list where the apiserver cannot stream a watch's
	// initial state (WatchList); the tested apiserver can, so they never
	// list here, but atoll-cloud must still start against one that cannot.
	{verb: "list", group: "", resource: "nodes"}:                                                   listFallback,
	{verb: "list", group: "", resource: "pods"}:                                                    listFallback,
	{verb: "list", group: "", resource: "endpoints"}:                                               listFallback,
	{verb: "list", group: "discovery.k8s.io", resource: "endpointslices"}:                          listFallback,
	{verb: "list", group: "", resource: "services"}:                                                listFallback,
	{verb: "list", group: "", resource: "configmaps", namespace: "atoll-system"}:                   listFallback,
	{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"}: listFallback,
	{verb: "create", group: "", resource: "configmaps", namespace: "atoll-system"}:                 applyCreates,
	{verb: "patch", group: "", resource: "endpoints"}:                                              restoredEndpoints,
	{verb: "patch", group: "discovery.k8s.io", resource: "endpointslices"}:                         restoredEndpoints,
	{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"}: "cloud/identity checks an atoll-edge pod's ServiceAccount token when " +
		"the node enrolls by it; the e2e's agents run as processes with bootstrap credentials, test/integration/install enrolls real pods this way",
}

// restoredEndpoints: with the pod readiness policy in force the pods of a
// protected node stay ready, so the e2e scenarios never need their
// endpoints restored.
const restoredEndpoints = "cloud/health restores the endpoints of a protected node whose pods were marked not ready before it entered the protected set, or with --webhook-fail-open (the policy only audits); cloud/health's tests exercise it against a real apiserver"

const listFallback = "client-go informers fall back to list on an apiserver without WatchList streaming"

// TestLeastPrivilege proves that deploy/base/atoll-cloud.yaml grants
// atoll-cloud nothing its code does not use: every verb on every resource
// (and name) the manifest grants its ServiceAccount was used by
// atoll-cloud during TestDistributedHealth and TestCloudOutage (the
// apiserver's audit log says so; notInE2E lists the exceptions with the
// reason). Those tests, run before it in the same go test run, also fail
// on any request the apiserver refused it. Run alone, it skips.
func TestLeastPrivilege(t *testing.T) {
	used.Lock()
	defer used.Unlock()
	for _, need := range []string{"TestDistributedHealth", "TestCloudOutage"} {
		if !used.tests[need] {
			t.Skipf("needs %s to pass first in the same run (go test -run 'TestDistributedHealth|TestCloudOutage|TestLeastPrivilege')", need)
		}
	}
	for _, g := range manifestGrants(t) {
		switch n := used.grants[g]; {
		case n > 0:
			t.Logf("used %d times: %s", n, g)
		case notInE2E[g] != "":
			t.Logf("not used in the e2e: %s: %s", g, notInE2E[g])
		default:
			t.Errorf("deploy/%s grants %s, which atoll-cloud never used: drop it", testbed.CloudManifest, g)
		}
	}
}

// forbiddenLines returns atoll-cloud's log lines that mention "forbidden".
func forbiddenLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, `"service":"atoll-cloud"`) && strings.Contains(strings.ToLower(l), "forbidden") {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(fmt.Errorf("read %s: %w", path, err))
	}
	return out
}

// TestGrantsFromManifest: the grants are read from the manifest's roles
// bound to the ServiceAccount, and a grant narrowed to a name or a
// namespace covers only that name or namespace, so TestLeastPrivilege
// and the refusal check compare like with like.
func TestGrantsFromManifest(t *testing.T) {
	grants := manifestGrants(t)
	find := func(verb, group, resource string) grant {
		for _, g := range grants {
			if g.verb == verb && g.group == group && g.resource == resource {
				return g
			}
		}
		t.Fatalf("no grant %s %s.%s in %v", verb, resource, group, grants)
		return grant{}
	}
	nodes := find("patch", "", "nodes")
	if !nodes.covers(grant{verb: "patch", resource: "nodes", name: "edge-1"}) || nodes.covers(grant{verb: "delete", resource: "nodes", name: "edge-1"}) {
		t.Error("patch nodes covers the wrong requests")
	}
	if nodes.covers(grant{verb: "patch", resource: "nodes/status", name: "edge-1"}) {
		t.Error("patch nodes covers nodes/status")
	}
	secret := find("update", "", "secrets")
	if secret.namespace != testbed.CloudNamespace || secret.name == "" {
		t.Fatalf("the Secret grant is not narrowed: %+v", secret)
	}
	if secret.covers(grant{verb: "update", resource: "secrets", namespace: testbed.CloudNamespace, name: "other"}) ||
		secret.covers(grant{verb: "update", resource: "secrets", namespace: "kube-system", name: secret.name}) {
		t.Error("a named, namespaced grant covers another name or namespace")
	}
}
