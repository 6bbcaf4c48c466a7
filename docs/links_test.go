package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestLinks: every relative link of the repository's Markdown (README.md,
// docs/, deploy/, the packages' READMEs, every other .md file) resolves: the
// file or directory it names exists, and a #anchor names a heading of the
// target page, by GitHub's rules for heading anchors.
func TestLinks(t *testing.T) {
	const root = ".."
	pages, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 10 {
		t.Fatalf("found only %d Markdown files under %s", len(pages), root)
	}
	anchors := map[string]map[string]bool{} // page path → its anchors
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := Anchors(string(b))
		anchors[path] = a
		return a, nil
	}
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, l := range Links(string(b)) {
			if err := checkLink(page, l.Target, anchorsOf); err != nil {
				t.Errorf("%s:%d: link %s: %v", rel, l.Line, l.Target, err)
			}
			checked++
		}
	}
	if checked < 100 {
		t.Fatalf("checked only %d links", checked)
	}
}

// markdownFiles lists the .md files under root, leaving out hidden
// directories (.git) and the build output (bin/).
func markdownFiles(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

var schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink resolves target relative to the page that holds it.
func checkLink(page, target string, anchorsOf func(string) (map[string]bool, error)) error {
	if schemeRE.MatchString(target) || strings.HasPrefix(target, "//") {
		return nil // absolute: not checked
	}
	p, frag, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(p)
	if err != nil {
		return err
	}
	dest := page
	if p != "" {
		dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(p))
	}
	st, err := os.Stat(dest)
	if err != nil {
		return fmt.Errorf("no such file or directory %s", dest)
	}
	if frag == "" || st.IsDir() || !strings.HasSuffix(dest, ".md") {
		return nil
	}
	a, err := anchorsOf(dest)
	if err != nil {
		return err
	}
	if !a[frag] {
		return fmt.Errorf("%s has no heading with the anchor #%s", dest, frag)
	}
	return nil
}

// Link is a link target found in a Markdown text, with its line.
type Link struct {
	Line   int
	Target string
}

var (
	inlineLinkRE = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	htmlRefRE    = regexp.MustCompile(`(?i)<(?:a|img)\s[^>]*?(?:href|src)="([^"]+)"`)
)

// Links returns the targets of the inline links and images, the link
// reference definitions and the HTML href/src attributes of md, leaving
// out code blocks and code spans.
func Links(md string) []Link {
	text := blankCode(md)
	var out []Link
	for _, re := range []*regexp.Regexp{inlineLinkRE, refDefRE, htmlRefRE} {
		for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
			out = append(out, Link{Line: 1 + strings.Count(text[:m[2]], "\n"), Target: text[m[2]:m[3]]})
		}
	}
	return out
}

var fenceRE = regexp.MustCompile("^\\s*(```+|~~~+)")

// blankCode replaces fenced code blocks and code spans by spaces, keeping
// the line breaks, so that what they show is not read as links or
// headings.
func blankCode(md string) string {
	lines := strings.Split(md, "\n")
	fence := ""
	for i, l := range lines {
		if m := fenceRE.FindStringSubmatch(l); m != nil {
			switch {
			case fence == "":
				fence = m[1]
				lines[i] = ""
				continue
			case strings.HasPrefix(m[1], fence[:1]) && len(m[1]) >= len(fence) && strings.TrimSpace(l) == m[1]:
				fence = ""
				lines[i] = ""
				continue
			}
		}
		if fence != "" {
			lines[i] = ""
		}
	}
	return blankSpans(strings.Join(lines, "\n"))
}

// blankSpans replaces every code span (a run of n backticks up to the next
// run of exactly n) by spaces, keeping line breaks.
func blankSpans(s string) string {
	b := []byte(s)
	run := func(i int) int {
		j := i
		for j < len(b) && b[j] == '`' {
			j++
		}
		return j - i
	}
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := run(i)
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := run(j)
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		for k := i; k < end+n; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end + n
	}
	return string(b)
}

var (
	headingRE  = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	htmlIDRE   = regexp.MustCompile(`(?i)<a\s[^>]*?(?:name|id)="([^"]+)"`)
	mdLinkRE   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTagRE  = regexp.MustCompile(`<[^>]+>`)
	emphasisRE = regexp.MustCompile(`\*+`)
)

// Anchors returns the anchors of md's headings, as GitHub makes them (and
// any HTML anchor name or id): the heading's text in lower case, spaces
// as '-', every character but letters, digits, marks, '-' and '_' dropped;
// a repeated anchor gets "-1", "-2", ...
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, l := range strings.Split(md, "\n") {
		if m := fenceRE.FindStringSubmatch(l); m != nil {
			if fence == "" {
				fence = m[1]
				continue
			}
			if strings.HasPrefix(m[1], fence[:1]) && len(m[1]) >= len(fence) && strings.TrimSpace(l) == m[1] {
				fence = ""
				continue
			}
		}
		if fence != "" {
			continue
		}
		for _, m := range htmlIDRE.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := Slug(m[1])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// Slug is GitHub's anchor of a heading's Markdown text.
func Slug(heading string) string {
	text := mdLinkRE.ReplaceAllString(heading, "$1")
	text = htmlTagRE.ReplaceAllString(text, "")
	text = strings.ReplaceAll(text, "`", "")
	text = emphasisRE.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	tests := []struct{ heading, want string }{
		{"Distributed health", "distributed-health"},
		{"atoll grid status, atoll grid resume", "atoll-grid-status-atoll-grid-resume"},
		{"Edge→hub traffic and the freshness rules", "edgehub-traffic-and-the-freshness-rules"},
		{"Capacity model: 100,000 nodes", "capacity-model-100000-nodes"},
		{"`atoll status`", "atoll-status"},
		{"Tunnel to the kubelets (kube-apiserver egress selector)", "tunnel-to-the-kubelets-kube-apiserver-egress-selector"},
		{"[cloud/grid](../cloud/grid/README.md) and *more*", "cloudgrid-and-more"},
		{"snake_case stays", "snake_case-stays"},
		{"internal/tunnelproto — the tunnel session protocol", "internaltunnelproto--the-tunnel-session-protocol"},
	}
	for _, tt := range tests {
		if got := Slug(tt.heading); got != tt.want {
			t.Errorf("Slug(%q) = %q, want %q", tt.heading, got, tt.want)
		}
	}
}

func TestLinksAndAnchors(t *testing.T) {
	md := "# Title\n\nSee [a](b.md#c) and ![img](x.png \"t\").\n\n" +
		"```\n[not](a-link.md)\n# not a heading\n```\n\n" +
		"`[code](span.md)` and [split\ntext](d.md).\n\n[ref]: e.md#f\n\n## Title\n"
	var got []string
	for _, l := range Links(md) {
		got = append(got, fmt.Sprintf("%d:%s", l.Line, l.Target))
	}
	if want := "3:b.md#c 3:x.png 11:d.md 13:e.md#f"; strings.Join(got, " ") != want {
		t.Errorf("Links = %v, want %s", got, want)
	}
	a := Anchors(md)
	if !a["title"] || !a["title-1"] || a["not-a-heading"] || len(a) != 2 {
		t.Errorf("Anchors = %v", a)
	}
}
