#!/usr/bin/env bash
# Prints the packages `go tool task test` runs before the end-to-end
# suite: every package but test/e2e, the longest first. go test starts
# packages in the order given, so the long ones (real nodes, real
# control planes) start at once instead of ending the run alone; the
# list is ordered by their durations in a clean-clone run (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
long=(
	test/integration/install
	services/atoll-demo
	test/chaos
	cloud/grid
	cloud/webhook
	cloud/health
	deploy
	test/integration/tunnel
	edge/viewfeed
	internal/tunnelproto
	edge/proxy
	test/edgesim
	test/integration/enrollment
	edge/natsnode
	test/integration/agent
	edge/localapi
	cloud/views/objects
	test/integration/kubelet
	test/kubenode
)
for p in "${long[@]}"; do
	echo "$module/$p"
done
go list ./... | grep -v -x -e "$module/test/e2e" $(printf -- "-e $module/%s " "${long[@]}")
