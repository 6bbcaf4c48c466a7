package main

import (
	"flag"
	"testing"

	"github.com/atoll-edge/atoll/docs"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/internal/cliflags"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference (go tool task docs:gen)")

// TestFlagsDoc: the atoll-edge block of docs/reference/flags.md is what
// the program's flags render. `go tool task docs:gen` rewrites it.
func TestFlagsDoc(t *testing.T) {
	t.Setenv("NODE_NAME", "") // --node-name's default; the page shows none
	cfg := edgeapp.Default()
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	const path = "../../docs/reference/flags.md"
	begin, end := "<!-- flags:"+prog+":begin (generated: go tool task docs:gen) -->", "<!-- flags:"+prog+":end -->"
	stale, err := docs.SyncBlock(path, begin, end, cliflags.Markdown(fs), *update)
	if err != nil {
		t.Fatal(err)
	}
	if stale {
		t.Fatalf("%s: the %s flags differ from the code; run `go tool task docs:gen` and commit", path, prog)
	}
}

// TestLocalAPIFlagsDoc: the atoll-edge local-api block of
// docs/reference/flags.md is what its flags render.
func TestLocalAPIFlagsDoc(t *testing.T) {
	fs, _, _, _ := localAPIFlags()
	const path = "../../docs/reference/flags.md"
	name := prog + " local-api"
	begin, end := "<!-- flags:"+name+":begin (generated: go tool task docs:gen) -->", "<!-- flags:"+name+":end -->"
	stale, err := docs.SyncBlock(path, begin, end, cliflags.Markdown(fs), *update)
	if err != nil {
		t.Fatal(err)
	}
	if stale {
		t.Fatalf("%s: the %s flags differ from the code; run `go tool task docs:gen` and commit", path, name)
	}
}
