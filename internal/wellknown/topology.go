package wellknown

// TopologyKeysAnnotation on a Service lists, comma-separated, the node
// label keys whose values decide which endpoints a node's kube-proxy sees
// (set by ServiceGrid, or by hand on a plain Service): the edge proxy keeps
// the endpoints on nodes sharing the host's value of the first key that
// yields any endpoint; "*" as the last key means any endpoint.
const TopologyKeysAnnotation = "topology.atoll.io/keys"
