package natsnode

import (
	"fmt"
	"slices"
	"testing"
)

func TestHubOrder(t *testing.T) {
	urls := []string{"nats-leaf://hub-0:7422", "nats-leaf://hub-1:7422", "nats-leaf://hub-2:7422"}
	reversed := slices.Clone(urls)
	slices.Reverse(reversed)

	first := map[string]int{}
	second := map[[2]string]int{}
	const nodes = 60
	for i := range nodes {
		node := fmt.Sprintf("site-%d-%d", i/3, i%3+1)
		got := HubOrder(node, urls)
		sorted := slices.Clone(got)
		slices.Sort(sorted)
		if !slices.Equal(sorted, urls) {
			t.Fatalf("%s: %v is not a permutation of %v", node, got, urls)
		}
		if again := HubOrder(node, reversed); !slices.Equal(again, got) {
			t.Fatalf("%s: order %v with the URLs listed the other way, %v before", node, again, got)
		}
		first[got[0]]++
		second[[2]string{got[0], got[1]}]++
	}
	// Spread: every server is the first choice of some nodes, and the
	// nodes of each server fail over to both others.
	for _, u := range urls {
		if first[u] < nodes/6 {
			t.Errorf("%s is the first choice of %d of %d nodes: %v", u, first[u], nodes, first)
		}
		for _, v := range urls {
			if u != v && second[[2]string{u, v}] == 0 {
				t.Errorf("no node of %s fails over to %s: %v", u, v, second)
			}
		}
	}

	if got := HubOrder("a", urls[:1]); !slices.Equal(got, urls[:1]) {
		t.Errorf("one URL: %v", got)
	}
	in := slices.Clone(urls)
	_ = HubOrder("a", in)
	if !slices.Equal(in, urls) {
		t.Errorf("HubOrder changed its argument: %v", in)
	}
}
