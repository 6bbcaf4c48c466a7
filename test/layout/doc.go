// Package layout holds the test that keeps the repository's imports
// pointing down (see ARCHITECTURE.md): runtime code never depends on a test
// harness, the edge never on client-go or the cloud, the shared protection
// rules only on the Kubernetes API types.
package layout
