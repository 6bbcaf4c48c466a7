#!/usr/bin/env bash
# Prints the packages whose tests start no Kubernetes component: neither
# the package nor its tests depend on the Kubernetes harness (test/kubetest
# and what builds on it), and it is not one that runs the kube binaries
# of bin/ by itself (edge/proxy runs kube-proxy and kubectl, edge/ipam the
# CNI plugin host-local). Used by
# `go tool task test:unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
go list -test -f '{{if .ForTest}}{{.ForTest}} {{join .Deps " "}}{{end}}' ./... |
	awk '{ if ($0 ~ /atoll\/test\/(kubetest|testbed|crds)( |$)/) slow[$1] = 1; else fast[$1] = 1 }
	     END { for (p in fast) if (!(p in slow)) print p }' |
	grep -v -e '/edge/proxy$' -e '/edge/ipam$' -e '/test/e2e$' | sort
