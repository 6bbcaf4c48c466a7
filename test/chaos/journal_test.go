package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The checker reads a journal still being written: a line without its
// newline waits for the next reading; a line that is not an entry is an
// error naming the file and where.
func TestJournalReaderTakesOnlyWholeEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), JournalFile)
	j, err := CreateJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	r := NewJournalReader(path)
	if err := j.Add(Entry{Phase: PhaseStart}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(`{"phase":"beg`); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Next(); err != nil || len(got) != 1 || got[0].Phase != PhaseStart {
		t.Fatalf("first reading: %v %+v, want the start alone", err, got)
	}
	if _, err := f.WriteString("in\",\"fault\":{\"id\":3}}\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Next(); err != nil || len(got) != 1 || got[0].Phase != PhaseBegin || got[0].Fault.ID != 3 {
		t.Fatalf("second reading: %v %+v, want the begin of #3", err, got)
	}
	if _, err := f.WriteString("not json\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "at byte") {
		t.Fatalf("garbage: %v, want an error naming the journal and the offset", err)
	}
}
