package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Phases of a journal entry.
const (
	PhaseStart  = "start"  // the schedule's time 0
	PhaseBegin  = "begin"  // a fault took effect
	PhaseEnd    = "end"    // a fault was undone
	PhaseFailed = "failed" // a fault could not be made or undone: Detail says why
	PhaseDone   = "done"   // the schedule ended
)

// Entry is one line of the journal: what the driver did, when. The
// checker knows the truth from it (and from nothing Atoll says).
type Entry struct {
	T      time.Time `json:"t"`
	Phase  string    `json:"phase"`
	Fault  Fault     `json:"fault,omitzero"`
	Detail string    `json:"detail,omitempty"`
}

// Journal appends entries to a file, one JSON object per line.
type Journal struct {
	mu sync.Mutex
	f  *os.File
}

// CreateJournal creates (or truncates) the journal at path.
func CreateJournal(path string) (*Journal, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("chaos: journal: %w", err)
	}
	return &Journal{f: f}, nil
}

// Add records e, stamped now if it has no time.
func (j *Journal) Add(e Entry) error {
	if e.T.IsZero() {
		e.T = time.Now()
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	_, err = j.f.Write(append(b, '\n'))
	return err
}

// Close closes the file.
func (j *Journal) Close() error { return j.f.Close() }

// JournalReader reads a journal that is still being written: Next
// returns the entries appended since its last call.
type JournalReader struct {
	path string
	off  int64
}

// NewJournalReader reads the journal at path from its start.
func NewJournalReader(path string) *JournalReader { return &JournalReader{path: path} }

// Next returns the complete entries appended since the last call (none
// if the file does not exist yet).
func (r *JournalReader) Next() ([]Entry, error) {
	f, err := os.Open(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(r.off, io.SeekStart); err != nil {
		return nil, err
	}
	var out []Entry
	br := bufio.NewReader(f)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			// A line without its newline is still being written.
			return out, nil //nolint:nilerr // io.EOF: read again later
		}
		r.off += int64(len(line))
		var e Entry
		if err := json.Unmarshal(line, &e); err != nil {
			return out, fmt.Errorf("chaos: journal %s at byte %d: %w", r.path, r.off-int64(len(line)), err)
		}
		out = append(out, e)
	}
}
