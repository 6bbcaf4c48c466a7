package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/cliflags"
)

func decode(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll decode", flag.ContinueOnError)
	typ := fs.String("type", "", "message type, e.g. atoll.v1.Vote (the Atoll-Type header)")
	subject := fs.String("subject", "", "subject the message arrived on; gives the type when --type is not set")
	compact := fs.Bool("compact", false, "print JSON on one line")
	if err := parseFlags(fs, args, stdout, "atoll decode [--type T | --subject S] [--compact] < payload"); err != nil {
		return err
	}
	t := *typ
	if t == "" {
		if *subject == "" {
			return cliflags.Usagef("decode: give --type or --subject")
		}
		var err error
		if t, err = events.TypeForSubject(*subject); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
	}
	data, err := io.ReadAll(io.LimitReader(stdin, 8<<20))
	if err != nil {
		return fmt.Errorf("decode: read stdin: %w", err)
	}
	m, err := events.Decode(t, data)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	out, err := toJSON(m, !*compact)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, string(out))
	return err
}

// toJSON renders m as JSON with stable whitespace (protojson varies its
// whitespace on purpose; scripts reading our output should not suffer it).
func toJSON(m proto.Message, indent bool) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	var out bytes.Buffer
	if indent {
		err = json.Indent(&out, b, "", "  ")
	} else {
		err = json.Compact(&out, b)
	}
	if err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	return out.Bytes(), nil
}
