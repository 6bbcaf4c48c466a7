package main

import (
	"errors"
	"io"
	"os"

	"golang.org/x/term"
)

// color is an ANSI SGR foreground colour sequence. Every one (plain
// included) is five bytes, so a table column whose cells are all painted
// stays aligned under text/tabwriter, which counts bytes.
type color string

const (
	plain  color = "\x1b[39m"
	red    color = "\x1b[31m"
	green  color = "\x1b[32m"
	yellow color = "\x1b[33m"
	reset        = "\x1b[0m"
)

// painter colours text, or leaves it alone when off.
type painter struct{ on bool }

func (p painter) paint(c color, s string) string {
	if !p.on {
		return s
	}
	return string(c) + s + reset
}

// colorFlag is the value of --color: auto, always or never.
type colorFlag string

func (c *colorFlag) String() string { return string(*c) }

func (c *colorFlag) Set(v string) error {
	switch v {
	case "auto", "always", "never":
		*c = colorFlag(v)
		return nil
	}
	return errors.New("want auto, always or never")
}

// painter decides: always and never as told; auto colours only when w is
// a terminal and $NO_COLOR is unset or empty (no-color.org).
func (c colorFlag) painter(w io.Writer) painter {
	switch c {
	case "always":
		return painter{on: true}
	case "never":
		return painter{}
	}
	if os.Getenv("NO_COLOR") != "" {
		return painter{}
	}
	f, ok := w.(*os.File)
	return painter{on: ok && term.IsTerminal(int(f.Fd()))}
}
