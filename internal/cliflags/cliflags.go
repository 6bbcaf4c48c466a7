// Package cliflags holds the flag types and environment fallback shared by
// Atoll's commands.
package cliflags

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// FromEnv sets every flag of fs that was not given on the command line
// from the environment variable prefix + the flag name in upper case with
// dashes as underscores (e.g. --hub-url ← ATOLL_HUB_URL). Call it after
// fs.Parse. A bad value is an error naming the variable.
func FromEnv(fs *flag.FlagSet, prefix string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		name := prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s: %w", name, e)
			}
		}
	})
	return err
}

// List is a flag.Value collecting repeated or comma-separated strings.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

// Set appends the comma-separated values of s.
func (l *List) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// Map is a flag.Value collecting key=value pairs.
type Map map[string]string

func (m *Map) String() string {
	keys := make([]string, 0, len(*m))
	for k := range *m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+(*m)[k])
	}
	return strings.Join(parts, ",")
}

// Set adds the comma-separated key=value pairs of s.
func (m *Map) Set(s string) error {
	if *m == nil {
		*m = map[string]string{}
	}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not key=value", kv)
		}
		(*m)[k] = v
	}
	return nil
}

// Float32 is a flag.Value for a float32 (client-go's QPS).
type Float32 float32

func (f *Float32) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 32) }

// Set parses s.
func (f *Float32) Set(s string) error {
	v, err := strconv.ParseFloat(s, 32)
	if err != nil {
		return err
	}
	*f = Float32(v)
	return nil
}

// Markdown renders fs's flags as a Markdown table (flag, default, usage),
// sorted by name: the reference of a command's flags in
// docs/reference/flags.md is generated from it. An empty default is "–";
// "|", "<" and ">" in a usage are escaped, so that a placeholder such as
// <unit> is not read as HTML.
func Markdown(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | usage |\n|---|---|---|\n")
	fs.VisitAll(func(f *flag.Flag) {
		def := "–"
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		usage := strings.NewReplacer("\n", " ", "|", `\|`, "<", "&lt;", ">", "&gt;").Replace(f.Usage)
		fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, def, usage)
	})
	return b.String()
}
