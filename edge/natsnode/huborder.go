package natsnode

import (
	"hash/fnv"
	"math/rand/v2"
	"slices"
)

// HubOrder is the order in which node dials the hub's leaf URLs: a
// permutation of urls seeded by the node's name. The leaf remote tries
// the first URL and, when its connection fails or closes, the next one
// (nats-server moves a failed URL to the end of the list), so:
//
//   - the nodes of a fleet spread over the hub's servers (each server is
//     the first choice of about 1/len(urls) of the nodes, whatever order
//     the operator listed the URLs in on every node);
//   - when a server dies, its nodes spread over the others too (the second
//     choice is as spread as the first);
//   - a node keeps its place across restarts, so an operator can tell
//     which server it uses (`atoll_natsnode_hub_server` names it) and the
//     hub's connection counts stay put when agents restart.
//
// nats-server would shuffle the URLs at random on every start; the order
// here is the same spread, made reproducible. Leafs do not move back to a
// server that returns: they stay where they reconnected until their
// connection closes again.
func HubOrder(node string, urls []string) []string {
	out := slices.Clone(urls)
	if len(out) < 2 {
		return out
	}
	// Sorted first: the permutation depends on the set of URLs, not on how
	// one node's flag happens to list them.
	slices.Sort(out)
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	seed := h.Sum64()
	// #nosec G404 -- a placement, not a secret.
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
