// Package logging builds the services' structured logger.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Config selects level and format.
type Config struct {
	// Level is debug, info, warn or error.
	Level string
	// Format is json or text.
	Format string
}

// Default logs info and above as JSON.
func Default() Config { return Config{Level: "info", Format: "json"} }

// New returns a logger writing to w.
func New(c Config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", c.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.Format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("log format %q: want json or text", c.Format)
	}
}
