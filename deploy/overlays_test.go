package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// find returns the object of kind and name in objs, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// atollCloud returns the one atoll-cloud workload of an overlay and its
// container, failing unless there is exactly one.
func atollCloud(t *testing.T, objs []*unstructured.Unstructured) (*unstructured.Unstructured, map[string]any) {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, kind := range []string{"Deployment", "StatefulSet", "DaemonSet"} {
		if o := find(objs, kind, "atoll-cloud"); o != nil {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d atoll-cloud workloads, want 1", len(found))
	}
	return found[0], container(t, found[0], "atoll-cloud")
}

// container returns the container name of a workload's pod template.
func container(t *testing.T, w *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(w.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	t.Fatalf("%s %s has no container %s", w.GetKind(), w.GetName(), name)
	return nil
}

// flag returns the value of --name=value in a container's args, if set.
func flag(c map[string]any, name string) (string, bool) {
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// env returns the literal value of a container's environment variable.
func env(c map[string]any, name string) string {
	vars, _, _ := unstructured.NestedSlice(c, "env")
	for _, v := range vars {
		if m, ok := v.(map[string]any); ok && m["name"] == name {
			s, _ := m["value"].(string)
			return s
		}
	}
	return ""
}

// replicas returns a workload's spec.replicas (1 when unset, as the
// apiserver defaults it).
func replicas(w *unstructured.Unstructured) int64 {
	n, ok := integer(w.Object, "spec", "replicas")
	if !ok {
		return 1
	}
	return n
}

// integer returns the number at fields of obj: decoded YAML holds
// float64s (JSON numbers) where the apiserver's objects hold int64s.
func integer(obj map[string]any, fields ...string) (int64, bool) {
	v, ok, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	switch v := v.(type) {
	case int64:
		return v, ok
	case float64:
		return int64(v), ok && v == float64(int64(v))
	}
	return 0, false
}

// selects reports whether selector (matchLabels) selects labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// hubServers returns the client URLs of the hub StatefulSet's pods, from
// its name, Service and replicas: what atoll-cloud must dial.
func hubServers(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	hub := find(objs, "StatefulSet", "atoll-hub")
	if hub == nil {
		t.Fatal("no StatefulSet atoll-hub (the NATS servers)")
	}
	svc, _, _ := unstructured.NestedString(hub.Object, "spec", "serviceName")
	var urls []string
	for i := range replicas(hub) {
		urls = append(urls, fmt.Sprintf("nats://%s-%d.%s.%s.svc:4222", hub.GetName(), i, svc, hub.GetNamespace()))
	}
	return urls
}

// TestOverlayContents: every overlay is a full installation (the CRDs,
// the base's objects, one atoll-cloud workload that the webhook and
// tunnel Services select), and each shape is what its name says: the
// embedded hub runs one atoll-cloud that dials no hub; the external one
// runs three NATS servers and atoll-cloud dials all three, as the edges
// list three leaf URLs; HA runs two or more atoll-cloud replicas with
// leader election, a PodDisruptionBudget and anti-affinity.
func TestOverlayContents(t *testing.T) {
	crds, err := deploy.CRDNames()
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs (%v)", err)
	}
	overlays := objects(t)
	for _, name := range wantOverlays {
		objs := overlays[name]
		t.Run(name, func(t *testing.T) {
			for _, f := range crds {
				// crds/apps.atoll.io_deploymentgrids.yaml holds
				// deploymentgrids.apps.atoll.io.
				group, plural, _ := strings.Cut(strings.TrimSuffix(path.Base(f), ".yaml"), "_")
				if find(objs, "CustomResourceDefinition", plural+"."+group) == nil {
					t.Errorf("no CustomResourceDefinition %s.%s (list %s in crds/kustomization.yaml)", plural, group, path.Base(f))
				}
			}
			for _, want := range []struct{ kind, name string }{
				{"Namespace", "atoll-system"},
				{"ServiceAccount", "atoll-cloud"},
				{"ClusterRole", "atoll-cloud"},
				{"ClusterRole", "atoll-cloud-grids"},
				{"MutatingWebhookConfiguration", "atoll-health"},
				{"Secret", "atoll-cloud-webhook-certs"},
				{"Service", "atoll-hub"},
				{"DaemonSet", "atoll-edge"},
			} {
				if find(objs, want.kind, want.name) == nil {
					t.Errorf("no %s %s", want.kind, want.name)
				}
			}
			cloud, c := atollCloud(t, objs)
			labels, _, _ := unstructured.NestedStringMap(cloud.Object, "spec", "template", "metadata", "labels")
			for _, svc := range []string{"atoll-cloud-webhook", "atoll-cloud-tunnel"} {
				s := find(objs, "Service", svc)
				if s == nil {
					t.Errorf("no Service %s", svc)
					continue
				}
				sel, _, _ := unstructured.NestedStringMap(s.Object, "spec", "selector")
				if !selects(sel, labels) {
					t.Errorf("Service %s selects %v, not atoll-cloud's pods (%v)", svc, sel, labels)
				}
			}
			if le, ok := flag(c, "leader-elect"); ok && le != "true" {
				t.Errorf("atoll-cloud runs with --leader-elect=%s", le)
			}
			edgeHub := strings.Split(env(container(t, find(objs, "DaemonSet", "atoll-edge"), "atoll-edge"), "ATOLL_HUB_URL"), ",")

			switch name {
			case "embedded-hub":
				if cloud.GetKind() != "StatefulSet" || replicas(cloud) != 1 {
					t.Errorf("atoll-cloud is a %s of %d replicas, want one StatefulSet replica (it holds the hub's store)", cloud.GetKind(), replicas(cloud))
				}
				if u, ok := flag(c, "hub-url"); ok {
					t.Errorf("the embedded hub's atoll-cloud dials --hub-url=%s", u)
				}
				if find(objs, "StatefulSet", "atoll-hub") != nil {
					t.Error("the embedded hub's overlay runs NATS servers")
				}
				if len(edgeHub) != 1 {
					t.Errorf("edges dial %v, want the one hub", edgeHub)
				}
			case "external-nats", "ha":
				want := hubServers(t, objs)
				if len(want) != 3 {
					t.Errorf("%d hub servers, want 3", len(want))
				}
				u, _ := flag(c, "hub-url")
				if got := strings.Split(u, ","); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
					t.Errorf("atoll-cloud --hub-url=%s, want every hub server: %v", u, want)
				}
				if r, _ := flag(c, "stream-replicas"); r != "3" {
					t.Errorf("atoll-cloud --stream-replicas=%q, want 3 (R3 on three servers)", r)
				}
				if len(edgeHub) != len(want) {
					t.Errorf("edges dial %v, want a leaf URL per hub server (%d)", edgeHub, len(want))
				}
				if cloud.GetKind() != "Deployment" {
					t.Errorf("atoll-cloud is a %s, want a Deployment (stateless with an external hub)", cloud.GetKind())
				}
			}

			pdb := find(objs, "PodDisruptionBudget", "atoll-cloud")
			anti, _, _ := unstructured.NestedSlice(cloud.Object, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
			if name != "ha" {
				if replicas(cloud) != 1 {
					t.Errorf("%d atoll-cloud replicas, want 1 (../ha runs more)", replicas(cloud))
				}
				return
			}
			if n := replicas(cloud); n < 2 {
				t.Errorf("%d atoll-cloud replicas, want >= 2", n)
			}
			if le, _ := flag(c, "leader-elect"); le != "true" {
				t.Errorf("HA atoll-cloud without --leader-elect=true (got %q)", le)
			}
			if pdb == nil {
				t.Fatal("no PodDisruptionBudget atoll-cloud")
			}
			sel, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
			if minAvail, _ := integer(pdb.Object, "spec", "minAvailable"); minAvail < 1 || minAvail >= replicas(cloud) || !selects(sel, labels) {
				t.Errorf("PodDisruptionBudget minAvailable %d selecting %v: want 1 <= minAvailable < %d replicas, selecting %v", minAvail, sel, replicas(cloud), labels)
			}
			spread := false
			for _, a := range anti {
				term, _, _ := unstructured.NestedMap(a.(map[string]any), "podAffinityTerm")
				key, _, _ := unstructured.NestedString(term, "topologyKey")
				asel, _, _ := unstructured.NestedStringMap(term, "labelSelector", "matchLabels")
				spread = spread || key == "kubernetes.io/hostname" && selects(asel, labels)
			}
			if !spread {
				t.Errorf("no anti-affinity spreading atoll-cloud over hosts: %v", anti)
			}
		})
	}
}

// TestTunnelComponent: components/tunnel-mtls gives atoll-cloud, in every
// shape, the TCP listener the Service atoll-cloud-tunnel points at, its
// three TLS flags on files of the mounted Secret atoll-cloud-tunnel-tls,
// and keeps the overlay's own arguments and volumes.
func TestTunnelComponent(t *testing.T) {
	overlays := objects(t)
	for _, name := range wantOverlays {
		t.Run(name, func(t *testing.T) {
			objs := overlays[name+"+tunnel-mtls"]
			_, plain := atollCloud(t, overlays[name])
			_, c := atollCloud(t, objs)
			plainArgs, _, _ := unstructured.NestedStringSlice(plain, "args")
			args, _, _ := unstructured.NestedStringSlice(c, "args")
			if !slices.Equal(args[:min(len(plainArgs), len(args))], plainArgs) {
				t.Errorf("the overlay's arguments changed: %v, then %v", plainArgs, args)
			}
			if addr, _ := flag(c, "tunnel-connect-addr"); addr != ":8132" {
				t.Errorf("--tunnel-connect-addr=%q, want :8132", addr)
			}
			svc := find(objs, "Service", "atoll-cloud-tunnel")
			if svc == nil {
				t.Fatal("no Service atoll-cloud-tunnel")
			}
			ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			if len(ports) != 1 {
				t.Fatalf("Service atoll-cloud-tunnel ports %v", ports)
			}
			if target, _ := integer(ports[0].(map[string]any), "targetPort"); target != 8132 {
				t.Errorf("Service atoll-cloud-tunnel targets port %d, atoll-cloud listens on 8132", target)
			}
			mount := ""
			mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			for _, m := range mounts {
				if m := m.(map[string]any); m["name"] == "tunnel-tls" {
					mount, _ = m["mountPath"].(string)
				}
			}
			if mount == "" {
				t.Fatal("no volume tunnel-tls mounted")
			}
			for _, f := range []string{"tunnel-connect-tls-cert", "tunnel-connect-tls-key", "tunnel-connect-client-ca"} {
				if v, _ := flag(c, f); path.Dir(v) != mount {
					t.Errorf("--%s=%q, want a file of %s", f, v, mount)
				}
			}
			cloud, _ := atollCloud(t, objs)
			vols, _, _ := unstructured.NestedSlice(cloud.Object, "spec", "template", "spec", "volumes")
			plainCloud, _ := atollCloud(t, overlays[name])
			plainVols, _, _ := unstructured.NestedSlice(plainCloud.Object, "spec", "template", "spec", "volumes")
			secret := ""
			for _, v := range vols {
				if v := v.(map[string]any); v["name"] == "tunnel-tls" {
					secret, _, _ = unstructured.NestedString(v, "secret", "secretName")
				}
			}
			if secret != "atoll-cloud-tunnel-tls" || len(vols) != len(plainVols)+1 {
				t.Errorf("volumes %v, want the overlay's %d and tunnel-tls from the Secret atoll-cloud-tunnel-tls", vols, len(plainVols))
			}
		})
	}
}

// TestLocalManifests: the files the testbed applies on their own
// (deploy.CloudManifest, deploy.GridsManifest) are embedded, and every
// overlay holds each of their objects as they are.
func TestLocalManifests(t *testing.T) {
	overlays := objects(t)
	for _, name := range []string{deploy.CloudManifest, deploy.GridsManifest} {
		data, err := deploy.Read(name)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := kubetest.DecodeManifests(name, data)
		if err != nil || len(objs) == 0 {
			t.Fatalf("%s: %d objects, %v", name, len(objs), err)
		}
		for _, o := range objs {
			for _, overlay := range wantOverlays {
				got := find(overlays[overlay], o.GetKind(), o.GetName())
				if got == nil || !reflect.DeepEqual(got.Object, o.Object) {
					t.Errorf("overlay %s: %s %s differs from %s", overlay, o.GetKind(), o.GetName(), name)
				}
			}
		}
	}
}

// TestReadmeOverlay renders the "Your own overlay" example of README.md
// beside a copy of deploy/: it must build, and set what it says (the
// images, the edges' hub URLs, the tunnel component).
func TestReadmeOverlay(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const start = "```yaml\n# my-atoll/kustomization.yaml\n"
	_, rest, ok := strings.Cut(string(readme), start)
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("README.md has no block starting %q", start)
	}
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "deploy"), deploy.Manifests()); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "my-atoll"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "my-atoll", "kustomization.yaml"), []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl, err := kubetest.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), kubectl, "kustomize", filepath.Join(dir, "my-atoll")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize of README.md's example: %v", err)
	}
	objs, err := kubetest.DecodeManifests("my-atoll", out)
	if err != nil {
		t.Fatal(err)
	}
	_, c := atollCloud(t, objs)
	edge := container(t, find(objs, "DaemonSet", "atoll-edge"), "atoll-edge")
	if img, _ := c["image"].(string); !strings.HasPrefix(img, "registry.example.com/") {
		t.Errorf("atoll-cloud image %q", img)
	}
	if img, _ := edge["image"].(string); !strings.HasPrefix(img, "registry.example.com/") {
		t.Errorf("atoll-edge image %q", img)
	}
	if u := env(edge, "ATOLL_HUB_URL"); !strings.Contains(u, "hub-a.example.net") {
		t.Errorf("edges dial %q", u)
	}
	if _, ok := flag(c, "tunnel-connect-addr"); !ok {
		t.Error("no tunnel listener")
	}
}

// TestPodHardening: in every overlay, each of Atoll's workloads runs at
// the priority class atoll-critical (which the overlay holds) with
// resource requests and a memory limit, RuntimeDefault seccomp, no
// privilege escalation, a read-only root filesystem and no capability;
// every pod but atoll-edge's (root only to own its hostPath state) runs
// as a non-root user that can read its Secret volumes (fsGroup, group
// read). No workload needs a control-plane node.
func TestPodHardening(t *testing.T) {
	for name, objs := range objects(t) {
		t.Run(name, func(t *testing.T) {
			if find(objs, "PriorityClass", "atoll-critical") == nil {
				t.Error("no PriorityClass atoll-critical")
			}
			for _, w := range objs {
				switch w.GetKind() {
				case "Deployment", "StatefulSet", "DaemonSet":
				default:
					continue
				}
				spec, _, _ := unstructured.NestedMap(w.Object, "spec", "template", "spec")
				what := w.GetKind() + " " + w.GetName()
				if pc, _, _ := unstructured.NestedString(spec, "priorityClassName"); pc != "atoll-critical" {
					t.Errorf("%s: priorityClassName %q, want atoll-critical", what, pc)
				}
				if sel, _, _ := unstructured.NestedStringMap(spec, "nodeSelector"); sel["node-role.kubernetes.io/control-plane"] != "" || len(sel) > 0 {
					t.Errorf("%s: nodeSelector %v: a managed cluster has no such node", what, sel)
				}
				pod, _, _ := unstructured.NestedMap(spec, "securityContext")
				if p, _, _ := unstructured.NestedString(pod, "seccompProfile", "type"); p != "RuntimeDefault" {
					t.Errorf("%s: seccomp profile %q, want RuntimeDefault", what, p)
				}
				// Root: atoll-edge (it owns its hostPath state) and the node
				// DNS (port 53 on the node's address, with that capability
				// alone).
				root := w.GetName() == "atoll-edge" || w.GetName() == "atoll-node-dns"
				containers, _, _ := unstructured.NestedSlice(spec, "containers")
				for _, ci := range containers {
					c := ci.(map[string]any)
					cname := what + "/" + c["name"].(string)
					sc, _, _ := unstructured.NestedMap(c, "securityContext")
					if v, ok, _ := unstructured.NestedBool(sc, "allowPrivilegeEscalation"); !ok || v {
						t.Errorf("%s: allowPrivilegeEscalation not false", cname)
					}
					if v, _, _ := unstructured.NestedBool(sc, "readOnlyRootFilesystem"); !v {
						t.Errorf("%s: root filesystem writable", cname)
					}
					if drop, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "drop"); !slices.Equal(drop, []string{"ALL"}) {
						t.Errorf("%s: drops capabilities %v, want [ALL]", cname, drop)
					}
					add, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "add")
					if w.GetName() == "atoll-node-dns" && slices.Equal(add, []string{"NET_BIND_SERVICE"}) {
						add = nil
					}
					if len(add) > 0 {
						t.Errorf("%s: adds capabilities %v", cname, add)
					}
					for _, r := range []string{"cpu", "memory"} {
						if v, _, _ := unstructured.NestedString(c, "resources", "requests", r); v == "" {
							t.Errorf("%s: no %s request", cname, r)
						}
					}
					limit, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
					if limit == "" {
						t.Errorf("%s: no memory limit", cname)
					}
					checkMemLimit(t, cname, c, limit)
					nonRoot, _, _ := unstructured.NestedBool(pod, "runAsNonRoot")
					if v, ok, _ := unstructured.NestedBool(sc, "runAsNonRoot"); ok {
						nonRoot = v
					}
					if nonRoot == root {
						t.Errorf("%s: runAsNonRoot %v, want %v", cname, nonRoot, !root)
					}
				}
				if root {
					continue
				}
				fsGroup, hasGroup := integer(pod, "fsGroup")
				volumes, _, _ := unstructured.NestedSlice(spec, "volumes")
				for _, vi := range volumes {
					v := vi.(map[string]any)
					if _, ok := v["secret"]; !ok {
						continue
					}
					mode, ok := integer(v, "secret", "defaultMode")
					if !hasGroup || fsGroup == 0 || (ok && mode&0o040 == 0) {
						t.Errorf("%s: Secret volume %s (mode %#o, fsGroup %d) unreadable by its non-root user", what, v["name"], mode, fsGroup)
					}
				}
			}
		})
	}
}

// TestHubImageIsTheTestedServer: the external hub's servers run the
// nats-server minor release every test runs (the module go.mod pins), as
// the official image's <major>.<minor>-alpine tag.
func TestHubImageIsTheTestedServer(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var version string
	for line := range strings.SplitSeq(string(mod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/nats-io/nats-server/v2" {
			version = f[1]
		}
	}
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		t.Fatalf("no nats-server version in go.mod (%q)", version)
	}
	want := "nats:" + parts[0] + "." + parts[1] + "-alpine"
	for _, name := range []string{"external-nats", "ha"} {
		hub := find(objects(t)[name], "StatefulSet", "atoll-hub")
		if hub == nil {
			t.Fatalf("%s: no StatefulSet atoll-hub", name)
		}
		if got := container(t, hub, "nats")["image"]; got != want {
			t.Errorf("%s: atoll-hub runs %v; the tests run nats-server %s: want %s", name, got, version, want)
		}
	}
}

// TestLeafTLSInEveryShape: every shape's leaf links run TLS with the
// certificate atoll-cloud generates. atoll-cloud generates it and the
// edges check it with the published CA bundle, by the certificate's name;
// the external hub's servers serve the pair of the Secret (never its CA
// key) from the files their nats.conf names, write the pid file the
// reloader signals, and share their process namespace and user with it.
func TestLeafTLSInEveryShape(t *testing.T) {
	for name, objs := range objects(t) {
		t.Run(name, func(t *testing.T) {
			if find(objs, "Secret", hubtls.DefaultSecret) == nil {
				t.Errorf("no Secret %s", hubtls.DefaultSecret)
			}
			_, c := atollCloud(t, objs)
			if v, _ := flag(c, "hub-leaf-certs"); v != cloudapp.HubLeafCertsGenerate {
				t.Errorf("atoll-cloud --hub-leaf-certs=%q, want %s", v, cloudapp.HubLeafCertsGenerate)
			}
			edge := container(t, find(objs, "DaemonSet", "atoll-edge"), "atoll-edge")
			if v, _ := flag(edge, "hub-tls-server-name"); v != hubtls.DefaultHost {
				t.Errorf("atoll-edge --hub-tls-server-name=%q, want %s", v, hubtls.DefaultHost)
			}
			ca, _ := flag(edge, "hub-ca-file")
			if mountedFrom(t, find(objs, "DaemonSet", "atoll-edge"), edge, ca) != "configmap "+hubtls.DefaultCABundle+" key "+hubtls.CAKey {
				t.Errorf("atoll-edge --hub-ca-file=%s is not the CA bundle's ConfigMap", ca)
			}
			hub := find(objs, "StatefulSet", "atoll-hub")
			if hub == nil {
				return // the embedded hub serves the certificate in process
			}
			cm := find(objs, "ConfigMap", "atoll-hub")
			conf, _, _ := unstructured.NestedString(cm.Object, "data", "nats.conf")
			nats, reloader := container(t, hub, "nats"), container(t, hub, "hub-leaf-reloader")
			for file, key := range map[string]string{"cert_file": "tls.crt", "key_file": "tls.key"} {
				path := confValue(conf, file)
				if got := mountedFrom(t, hub, nats, path); got != "secret "+hubtls.DefaultSecret+" key "+key {
					t.Errorf("nats.conf %s %q: mounted from %q, want the Secret's %s", file, path, got, key)
				}
			}
			leaf, _, _ := strings.Cut(conf[strings.Index(conf, "leafnodes {"):], "\n    }")
			if !strings.Contains(leaf, "tls {") {
				t.Errorf("nats.conf's leafnodes block has no tls:\n%s", leaf)
			}
			vols, _, _ := unstructured.NestedSlice(hub.Object, "spec", "template", "spec", "volumes")
			for _, v := range vols {
				items, _, _ := unstructured.NestedSlice(v.(map[string]any), "secret", "items")
				for _, it := range items {
					if it.(map[string]any)["key"] == "ca.key" {
						t.Error("the hub servers mount the CA's key")
					}
				}
			}
			for flagName, want := range map[string]string{"cert": confValue(conf, "cert_file"), "key": confValue(conf, "key_file"), "pid-file": confValue(conf, "pid_file")} {
				if got, _ := flag(reloader, flagName); got != want {
					t.Errorf("hub-leaf-reloader --%s=%q, nats.conf says %q", flagName, got, want)
				}
				if mountedFrom(t, hub, reloader, want) != mountedFrom(t, hub, nats, want) {
					t.Errorf("hub-leaf-reloader does not see the server's %s", want)
				}
			}
			if share, _, _ := unstructured.NestedBool(hub.Object, "spec", "template", "spec", "shareProcessNamespace"); !share {
				t.Error("atoll-hub does not share its process namespace: the reloader cannot signal the server")
			}
			nu, _ := integer(nats, "securityContext", "runAsUser")
			ru, _ := integer(reloader, "securityContext", "runAsUser")
			if nu != ru || nu == 0 {
				t.Errorf("nats runs as %d and hub-leaf-reloader as %d: the reloader needs the server's user", nu, ru)
			}
		})
	}
}

// confValue is the value of "key: value" in a nats.conf.
func confValue(conf, key string) string {
	for line := range strings.SplitSeq(conf, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}

// mountedFrom says where the file at path in container c of workload w
// comes from (the deepest mount that holds it): "secret S key K",
// "configmap M key K", "emptydir V", or "" when no volume mount holds it.
func mountedFrom(t *testing.T, w *unstructured.Unstructured, c map[string]any, path string) string {
	t.Helper()
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	vols, _, _ := unstructured.NestedSlice(w.Object, "spec", "template", "spec", "volumes")
	var mm map[string]any
	var rel string
	for _, m := range mounts {
		dir := m.(map[string]any)["mountPath"].(string)
		if r, ok := strings.CutPrefix(path, strings.TrimSuffix(dir, "/")+"/"); ok && (mm == nil || len(r) < len(rel)) {
			mm, rel = m.(map[string]any), r
		}
	}
	if mm != nil {
		for _, v := range vols {
			vm := v.(map[string]any)
			if vm["name"] != mm["name"] {
				continue
			}
			if _, ok := vm["emptyDir"]; ok {
				return "emptydir " + vm["name"].(string)
			}
			for kind, field := range map[string]string{"secret": "secretName", "configMap": "name"} {
				src, ok := vm[kind].(map[string]any)
				if !ok {
					continue
				}
				key := rel
				items, _, _ := unstructured.NestedSlice(src, "items")
				for _, it := range items {
					if im := it.(map[string]any); im["path"] == rel {
						key = im["key"].(string)
					}
				}
				return strings.ToLower(kind) + " " + src[field].(string) + " key " + key
			}
		}
	}
	return ""
}

// TestHubVolumeComponent: the embedded hub keeps its store in an
// emptyDir by default (no PersistentVolumeClaim: it schedules on a
// cluster without a StorageClass); components/hub-volume puts it on a
// claim of the same name instead, mounted where the container mounts it,
// and changes nothing in the overlays that have no such store.
func TestHubVolumeComponent(t *testing.T) {
	all := objects(t)
	store := func(objs []*unstructured.Unstructured) (emptyDir, claim bool) {
		sts := find(objs, "StatefulSet", "atoll-cloud")
		vols, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			if m := v.(map[string]any); m["name"] == "store" {
				_, emptyDir = m["emptyDir"]
			}
		}
		claims, _, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates")
		for _, c := range claims {
			if n, _, _ := unstructured.NestedString(c.(map[string]any), "metadata", "name"); n == "store" {
				claim = true
			}
		}
		if mountedFrom(t, sts, container(t, sts, "atoll-cloud"), "/var/lib/atoll/hub/x") == "" && !claim {
			t.Error("atoll-cloud mounts no store at /var/lib/atoll")
		}
		return emptyDir, claim
	}
	if e, c := store(all["embedded-hub"]); !e || c {
		t.Errorf("embedded-hub: store in an emptyDir %v, on a claim %v; want the emptyDir only", e, c)
	}
	if e, c := store(all["embedded-hub+hub-volume"]); e || !c {
		t.Errorf("embedded-hub+hub-volume: store in an emptyDir %v, on a claim %v; want the claim only", e, c)
	}
	for _, name := range []string{"external-nats", "ha"} {
		if !reflect.DeepEqual(all[name], all[name+"+hub-volume"]) {
			t.Errorf("components/hub-volume changes %s", name)
		}
	}
}

// checkMemLimit: a container's GOMEMLIMIT, if it sets one, is below its
// memory limit, with room for what Go does not count (atoll-cloud and
// atoll-edge derive theirs from the cgroup: internal/memlimit).
func checkMemLimit(t *testing.T, cname string, c map[string]any, limit string) {
	t.Helper()
	env, _, _ := unstructured.NestedSlice(c, "env")
	for _, e := range env {
		e := e.(map[string]any)
		if e["name"] != "GOMEMLIMIT" {
			continue
		}
		v, _ := e["value"].(string)
		soft, err := resource.ParseQuantity(strings.TrimSuffix(v, "B"))
		if err != nil {
			t.Errorf("%s: GOMEMLIMIT %q: %v", cname, v, err)
			continue
		}
		hard, err := resource.ParseQuantity(limit)
		if err != nil || limit == "" {
			t.Errorf("%s: GOMEMLIMIT %s without a memory limit to stay under", cname, v)
			continue
		}
		if r := float64(soft.Value()) / float64(hard.Value()); r > 0.95 || r < 0.7 {
			t.Errorf("%s: GOMEMLIMIT %s is %.0f %% of the memory limit %s, want 70–95 %%", cname, v, 100*r, limit)
		}
	}
}
