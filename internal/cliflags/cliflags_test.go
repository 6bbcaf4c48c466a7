package cliflags

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFromEnv(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	url := fs.String("hub-url", "default", "")
	port := fs.Int("route-port", 1, "")
	name := fs.String("node-name", "", "")
	t.Setenv("ATOLL_HUB_URL", "from-env")
	t.Setenv("ATOLL_NODE_NAME", "env-name")
	if err := fs.Parse([]string{"--node-name=flag-name"}); err != nil {
		t.Fatal(err)
	}
	if err := FromEnv(fs, "ATOLL_"); err != nil {
		t.Fatal(err)
	}
	if *url != "from-env" || *port != 1 || *name != "flag-name" {
		t.Fatalf("url=%q port=%d name=%q: the environment fills unset flags only", *url, *port, *name)
	}
	t.Setenv("ATOLL_ROUTE_PORT", "many")
	if err := FromEnv(fs, "ATOLL_"); err == nil || !strings.Contains(err.Error(), "ATOLL_ROUTE_PORT") {
		t.Fatalf("bad value: %v", err)
	}
}

func TestListAndMap(t *testing.T) {
	var l List
	_ = l.Set("a, b")
	_ = l.Set("c")
	if l.String() != "a,b,c" {
		t.Fatalf("list = %q", l.String())
	}
	var m Map
	if err := m.Set("k=v,x=y"); err != nil || m.String() != "k=v,x=y" {
		t.Fatalf("map = %q %v", m.String(), err)
	}
	if err := m.Set("novalue"); err == nil {
		t.Fatal("accepted a pair without =")
	}
}

func TestFloat32(t *testing.T) {
	var f float32 = 100
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var((*Float32)(&f), "qps", "")
	if err := fs.Parse([]string{"--qps=12.5"}); err != nil || f != 12.5 {
		t.Fatalf("--qps=12.5: %v, %v", f, err)
	}
	if err := fs.Parse([]string{"--qps=fast"}); err == nil {
		t.Fatal("--qps=fast accepted")
	}
	if got := (*Float32)(&f).String(); got != "12.5" {
		t.Fatalf("String() = %q", got)
	}
}

func TestMarkdown(t *testing.T) {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.String("zone", "", "the zone <name> | or none")
	fs.Duration("period", 2*time.Second, "how often")
	fs.Bool("console", true, "serve the page")
	var l List
	fs.Var(&l, "hub-url", "hub URLs\n(repeatable)")
	want := "| flag | default | usage |\n|---|---|---|\n" +
		"| `--console` | `true` | serve the page |\n" +
		"| `--hub-url` | – | hub URLs (repeatable) |\n" +
		"| `--period` | `2s` | how often |\n" +
		"| `--zone` | – | the zone &lt;name&gt; \\| or none |\n"
	if got := Markdown(fs); got != want {
		t.Fatalf("Markdown:\n%s\nwant:\n%s", got, want)
	}
}
