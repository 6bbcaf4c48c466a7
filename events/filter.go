package events

import (
	"fmt"
	"strings"
)

// Filter is the family's subject with the named tokens of values filled in
// and every other named token a '*' wildcard: e.g. every vote one voter
// casts in its unit. A value is a name (dots travel as '~'); a name the
// pattern does not have is an error.
func (f *Family) Filter(values map[string]string) (string, error) {
	for name, v := range values {
		if !containsName(f.names, name) {
			return "", fmt.Errorf("filter %s: no token <%s>", f.Pattern, name)
		}
		if err := ValidName(v); err != nil {
			return "", fmt.Errorf("filter %s: %s: %w", f.Pattern, name, err)
		}
		if err := f.checkValue(name, v); err != nil {
			return "", fmt.Errorf("filter %s: %w", f.Pattern, err)
		}
	}
	out := make([]string, len(f.tokens))
	for i, t := range f.tokens {
		switch v, ok := values[t.name]; {
		case t.literal != "":
			out[i] = t.literal
		case ok:
			out[i] = Token(v)
		default:
			out[i] = "*"
		}
	}
	return strings.Join(out, "."), nil
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

// InboxPrefix is the reply inbox prefix of node's connections (its edge
// agent's): its credentials let it hear only this inbox, not another
// node's replies.
func InboxPrefix(node string) string { return "_INBOX_" + Token(node) }
