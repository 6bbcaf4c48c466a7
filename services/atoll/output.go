package main

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// outputFlag is the value of -o/--output: "" (the command's default
// table) or one of accepted.
type outputFlag struct {
	value    string
	accepted []string
}

func (o *outputFlag) String() string {
	if o == nil {
		return ""
	}
	return o.value
}

func (o *outputFlag) Set(v string) error {
	if !slices.Contains(o.accepted, v) {
		return fmt.Errorf("want one of %s", strings.Join(o.accepted, ", "))
	}
	o.value = v
	return nil
}

// toYAML renders m as YAML: its protojson form (proto field names), as
// -o json prints it, converted.
func toYAML(m proto.Message) ([]byte, error) {
	j, err := toJSON(m, false)
	if err != nil {
		return nil, err
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		return nil, fmt.Errorf("encode YAML: %w", err)
	}
	return y, nil
}
