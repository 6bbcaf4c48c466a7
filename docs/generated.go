package docs

import (
	"fmt"
	"os"
	"strings"
)

// Generated blocks. The reference pages in docs/reference hold tables
// rendered from the code between two marker lines (an HTML comment each,
// invisible on the rendered page). The test of the package that owns the
// code compares the block with what the code renders and fails when they
// differ; `go tool task docs:gen` runs those tests with -update, which
// rewrites the blocks.

// Block returns the text between the line begin and the line end of doc.
func Block(doc, begin, end string) (string, error) {
	_, rest, ok := strings.Cut(doc, begin+"\n")
	if !ok {
		return "", fmt.Errorf("no %q line", begin)
	}
	body, _, ok := strings.Cut(rest, end)
	if !ok {
		return "", fmt.Errorf("no %q after %q", end, begin)
	}
	return body, nil
}

// ReplaceBlock returns doc with the text between the line begin and the
// line end replaced by body.
func ReplaceBlock(doc, begin, end, body string) (string, error) {
	head, rest, ok := strings.Cut(doc, begin+"\n")
	if !ok {
		return "", fmt.Errorf("no %q line", begin)
	}
	_, tail, ok := strings.Cut(rest, end)
	if !ok {
		return "", fmt.Errorf("no %q after %q", end, begin)
	}
	return head + begin + "\n" + body + end + tail, nil
}

// SyncBlock compares the block between begin and end of the file at path
// with want. With update it rewrites the block instead when they differ.
// stale reports a block that differs and was not rewritten.
func SyncBlock(path, begin, end, want string, update bool) (stale bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	got, err := Block(string(b), begin, end)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	if got == want {
		return false, nil
	}
	if !update {
		return true, nil
	}
	doc, err := ReplaceBlock(string(b), begin, end, want)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return false, os.WriteFile(path, []byte(doc), 0o644)
}
