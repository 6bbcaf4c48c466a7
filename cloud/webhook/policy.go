package webhook

import "github.com/atoll-edge/atoll/internal/protect"

// Policy says which nodes Atoll protects; see protect.Policy. The health
// service implements it, and also protect.NodePolicy and protect.PodPolicy.
type Policy = protect.Policy

// PolicyFunc adapts a function to Policy.
type PolicyFunc = protect.PolicyFunc
