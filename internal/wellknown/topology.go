package wellknown

// TopologyKeysAnnotation on a Service lists, comma-separated, the node
// label keys whose values decide which endpoints a node's kube-proxy sees
// (set by ServiceGrid, or by hand on a plain Service): the edge proxy keeps
// the endpoints on nodes sharing the host's value of the first key that
// yields any endpoint; "*" as the last key means any endpoint.
const TopologyKeysAnnotation = "topology.atoll.io/keys"

// EndpointTopologyAnnotation is the annotation that, on the cloud's view
// of an EndpointSlice or Endpoints whose Service has topology keys, holds
// as JSON, for each node of its endpoints, that node's values of those keys
// ({"node-a":{"topology.kubernetes.io/zone":"z1"}}): the edge proxy's
// topology filter reads it instead of every Node's labels. Only the views
// carry it, never the objects in the apiserver.
const EndpointTopologyAnnotation = "topology.atoll.io/endpoint-topology"
