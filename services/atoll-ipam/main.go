// Command atoll-ipam is Atoll's CNI IPAM plugin (edge/ipam): installed
// beside the CNI plugins (e.g. /opt/cni/bin) and named as the "ipam" type
// of a network whose addresses come from host-local, it gives a pod whose
// sandbox is created again on the same node (after a reboot with the
// cloud unreachable) the address it had.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/atoll-edge/atoll/edge/ipam"
)

func main() {
	skel.PluginMainFuncs(ipam.Plugin{}.Funcs(), version.All,
		"atoll-ipam: a pod gets its previous address back when its sandbox is created again (delegates to host-local)")
}
