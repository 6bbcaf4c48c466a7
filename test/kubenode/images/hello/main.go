// Command hello is the test workload of test/kubenode's nodes: an HTTP
// server on :8080 that answers every request with "hello from <pod>"
// (its hostname), and exits on SIGTERM. `hello get URL` is its client:
// it prints the body of one GET of URL (within 3 s), or fails. `hello
// poll URL` calls URL every half second, on a new connection each time,
// until SIGTERM and prints a line per call, "ok <body>" or "fail <error>"
// (test/chaos reads them from the node's container logs).
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "get" {
		if err := get(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "poll" {
		poll(os.Args[2])
		return
	}
	host, _ := os.Hostname()
	srv := &http.Server{
		Addr:              ":8080",
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", host)
		}),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func poll(url string) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		var body strings.Builder
		if err := fetch(url, 2*time.Second, &body); err != nil {
			fmt.Println("fail", err)
		} else {
			fmt.Println("ok", strings.TrimSpace(body.String()))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func get(url string) error { return fetch(url, 3*time.Second, os.Stdout) }

func fetch(url string, timeout time.Duration, out io.Writer) error {
	// A connection per call: each is routed anew (a kept-alive one stays
	// with its backend after the Service's endpoints move, as any
	// established connection does through kube-proxy).
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url) //nolint:noctx // bounded by the client's timeout
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = io.Copy(out, resp.Body)
	return err
}
