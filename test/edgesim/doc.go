// Package edgesim simulates edge nodes against a real kube-apiserver, for
// tests and the local demo. One Simulator runs thousands of nodes from one
// process: it registers each Node (labels, InternalIP, capacity, Ready=True),
// renews its Lease in kube-node-lease like a kubelet, and runs the pods bound
// to it (reports them Running and Ready with a pod IP from the node's /24 and
// finishes their deletion). Partition stops all of that for one node, as a
// lost cloud link would, so the real kube-controller-manager reacts; Heal
// resumes it.
//
// All writes are server-side apply with FieldManager (Force, as a kubelet
// owns its node and pod status), except Lease renewals, which are updates of
// the cached Lease with a re-read on conflict.
package edgesim
