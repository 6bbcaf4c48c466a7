package kubetest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Binary names looked up in the bin directory.
const (
	binEtcd              = "etcd"
	binAPIServer         = "kube-apiserver"
	binControllerManager = "kube-controller-manager"
	binScheduler         = "kube-scheduler"
)

const (
	// BinDirEnv overrides where the control-plane binaries are looked up.
	BinDirEnv = "ATOLL_BIN_DIR"
	// rootModule names the repository's root module, whose go.mod marks
	// the directory that holds bin/.
	rootModule = "github.com/atoll-edge/atoll"
	// BuildHint tells the user how to produce the binaries.
	BuildHint = "run `go tool task kube:build` from the repository root (or set " + BinDirEnv + ")"
)

// ErrBinaryMissing reports a control-plane binary that is not built.
var ErrBinaryMissing = errors.New("control-plane binary missing")

// FindBinDir returns $ATOLL_BIN_DIR if set, else <repo>/bin where <repo> is
// the nearest ancestor of the working directory whose go.mod declares the
// github.com/atoll-edge/atoll module.
func FindBinDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return filepath.Abs(dir)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find bin dir: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if modulePath(filepath.Join(dir, "go.mod")) == rootModule {
			return filepath.Join(dir, "bin"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find bin dir: no go.mod for module %s above %s; set %s", rootModule, wd, BinDirEnv)
		}
	}
}

// modulePath returns the module path declared by the go.mod file at path,
// or "" when it cannot be read.
func modulePath(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// checkBinaries reports the first of names that is not an executable file
// in dir.
func checkBinaries(dir string, names ...string) error {
	for _, name := range names {
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%w: %s not found in %s: %s", ErrBinaryMissing, name, dir, BuildHint)
		}
	}
	return nil
}

// Kubectl returns the kubectl built by `go tool task kube:build` from the
// pinned k8s.io/kubernetes (in $ATOLL_BIN_DIR, else <repo>/bin), so that the
// client-side checks run the same version as the control plane.
func Kubectl() (string, error) {
	dir, err := FindBinDir()
	if err != nil {
		return "", err
	}
	if err := checkBinaries(dir, "kubectl"); err != nil {
		return "", err
	}
	return filepath.Join(dir, "kubectl"), nil
}
