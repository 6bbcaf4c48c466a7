package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
)

func decode(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll decode", flag.ContinueOnError)
	typ := fs.String("type", "", "message type, e.g. atoll.v1.Vote (the Atoll-Type header)")
	subject := fs.String("subject", "", "subject the message arrived on; gives the type when --type is not set")
	compact := fs.Bool("compact", false, "print JSON on one line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t := *typ
	if t == "" {
		if *subject == "" {
			return errors.New("decode: give --type or --subject")
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

func toJSON(m proto.Message, indent bool) ([]byte, error) {
	o := protojson.MarshalOptions{UseProtoNames: true}
	if indent {
		o.Multiline, o.Indent = true, "  "
	}
	b, err := o.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	return b, nil
}
