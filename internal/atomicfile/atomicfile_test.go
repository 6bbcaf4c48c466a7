package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "f.json")
	for _, want := range []string{"first", "second, longer"} {
		if err := Write(path, []byte(want), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), TempPrefix+"*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := Write(filepath.Join(path, "under-a-file"), nil, 0o600); err == nil {
		t.Error("a write under a regular file worked")
	}
}
