package kubenode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The cluster DNS of a fleet with Config.DNS: CoreDNS (built by
// tools/dns) as kubeadm installs it — the Deployment coredns and the
// Service kube-dns of kube-system, at the tenth address of the service
// range, which every node's kubelet gives its pods as their nameserver.

// corefile is kubeadm's, less what this machine cannot use: there is no
// upstream resolver to forward other names to, so they are answered
// SERVFAIL at once instead of after a forward's timeout.
const corefile = `.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loadbalance
    reload
}
`

// DNSIP is the cluster DNS Service's address: the tenth of the service
// range, as kubeadm picks it.
func (f *Fleet) DNSIP() (string, error) {
	p, err := netip.ParsePrefix(f.cluster.Config().ServiceClusterIPRange)
	if err != nil {
		return "", fmt.Errorf("kubenode: service range: %w", err)
	}
	a := p.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	return a.String(), nil
}

// startDNS pushes CoreDNS's image and creates its objects; its pod runs
// once a node is Ready.
func (f *Fleet) startDNS(ctx context.Context) error {
	bin := filepath.Join(f.cfg.BinDir, "coredns")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("kubenode: coredns not built (go tool task dns:build): %w", err)
	}
	if err := f.images.push(ctx, "coredns:"+builtinTag, bin); err != nil {
		return err
	}
	ip, err := f.DNSIP()
	if err != nil {
		return err
	}
	c := f.cluster.Client()
	const ns, name = "kube-system", "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"Corefile": corefile}}
	replicas := int32(1)
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				ServiceAccountName: name,
				DNSPolicy:          corev1.DNSDefault,
				PriorityClassName:  "system-cluster-critical",
				Containers: []corev1.Container{{
					Name: "coredns", Image: f.Image("coredns"), Args: []string{"-conf", "/etc/coredns/Corefile"},
					Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
						{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}}},
					LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}}},
					VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
				}},
				Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
					ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}},
			}}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-dns", Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Selector: labels, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
		}}}
	existing := func(_ any, err error) error {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	opts := metav1.CreateOptions{}
	if err := errors.Join(
		existing(c.RbacV1().ClusterRoles().Create(ctx, role, opts)),
		existing(c.RbacV1().ClusterRoleBindings().Create(ctx, binding, opts)),
		existing(c.CoreV1().ServiceAccounts(ns).Create(ctx, sa, opts)),
		existing(c.CoreV1().ConfigMaps(ns).Create(ctx, cm, opts)),
		existing(c.CoreV1().Services(ns).Create(ctx, svc, opts)),
		existing(c.AppsV1().Deployments(ns).Create(ctx, deploy, opts)),
	); err != nil {
		return fmt.Errorf("kubenode: cluster DNS: %w", err)
	}
	return nil
}
