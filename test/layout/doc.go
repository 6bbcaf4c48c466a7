// Package layout holds the tests that keep the repository's imports
// pointing down (docs/architecture.md): runtime code never depends on a
// test harness; the edge never on client-go or the cloud, and the cloud
// never on the edge, in their tests too (what crosses both lives in
// test/integration and test/e2e); each harness imports only what it is
// meant to start; the shared protection rules depend only on the
// Kubernetes API types.
package layout
