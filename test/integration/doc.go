// Package integration holds, one package per area, the tests that cross
// the cloud and the edge without a whole installation: a cloud component
// against the real edge component it talks to, over a real hub.
//
//   - agent: atoll-edge's whole graph (edge/edgeapp) against atoll-cloud's
//     (cloud/cloudapp): unit security, steady state, logs;
//   - enrollment: the identity service (cloud/identity) and the edge
//     enroller (edge/enroll): bootstrap tokens, renewal, revocation;
//   - fabric: the hub (cloud/hub, cloud/hubclient) with edge NATS servers:
//     interest isolation, an external hub, leaf capacity;
//   - hostrecords: the StatefulSetGrid records publisher and the edge
//     hosts writer;
//   - tunnel: the tunnel server (cloud/tunnel) and agent (edge/tunnel),
//     with the tunnel benchmarks;
//   - kubelet: against real kubelets and containerd (test/kubenode): the
//     edge prober's checks, Atoll's images running on a node;
//   - install: Atoll installed as a user installs it, its images and
//     manifests on real nodes, and distributed health on them.
//
// The end-to-end suite over a whole installation of processes is
// test/e2e.
package integration
