// Package kubetest runs a real Kubernetes control plane on loopback for tests
// and the local demo: etcd, kube-apiserver and, on request,
// kube-controller-manager and kube-scheduler, built from pinned modules by
// `go tool task kube:build` into <repo>/bin.
//
// Tests call Start(t, ...), which stops everything in t.Cleanup; programs
// call StartCluster(ctx, Config) and Cluster.Stop. Each process runs in its
// own process group with SIGKILL as its parent-death signal, so a killed test
// binary leaves nothing behind. Nodes are not run here; see
// internal/edgesim for simulated nodes.
package kubetest
