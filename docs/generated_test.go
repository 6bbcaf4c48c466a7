package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBlocks(t *testing.T) {
	const begin, end = "<!-- x:begin -->", "<!-- x:end -->"
	doc := "# T\n\n" + begin + "\nold\n" + end + "\n\nafter\n"
	if got, err := Block(doc, begin, end); err != nil || got != "old\n" {
		t.Fatalf("Block = %q, %v", got, err)
	}
	got, err := ReplaceBlock(doc, begin, end, "new\nrows\n")
	if want := "# T\n\n" + begin + "\nnew\nrows\n" + end + "\n\nafter\n"; err != nil || got != want {
		t.Fatalf("ReplaceBlock = %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"no markers\n", begin + "\nno end\n", end + "\n" + begin + "\n"} {
		if _, err := Block(bad, begin, end); err == nil {
			t.Errorf("Block(%q): no error", bad)
		}
		if _, err := ReplaceBlock(bad, begin, end, "x\n"); err == nil {
			t.Errorf("ReplaceBlock(%q): no error", bad)
		}
	}

	path := filepath.Join(t.TempDir(), "ref.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if stale, err := SyncBlock(path, begin, end, "old\n", false); stale || err != nil {
		t.Fatalf("current block: stale %v, %v", stale, err)
	}
	if stale, err := SyncBlock(path, begin, end, "new\n", false); !stale || err != nil {
		t.Fatalf("changed block: stale %v, %v", stale, err)
	}
	if stale, err := SyncBlock(path, begin, end, "new\n", true); stale || err != nil {
		t.Fatalf("update: stale %v, %v", stale, err)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), begin+"\nnew\n"+end+"\n\nafter\n") {
		t.Fatalf("after update:\n%s", b)
	}
}
