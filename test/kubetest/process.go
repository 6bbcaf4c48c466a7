package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/test/freeport"
)

// process is one control-plane binary running in its own process group,
// with stdout and stderr in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File

	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done is closed

	stopOnce sync.Once
	stopErr  error
}

// startProcess starts bin with args. The child gets its own process group
// (so stop reaches any children it forks) and SIGKILL when the thread that
// started it dies, so a killed test binary leaks nothing.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "### %s %s %q\n", time.Now().Format(time.RFC3339Nano), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = filepath.Dir(logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		if p.waitErr == nil {
			return true, fmt.Errorf("%s exited", p.name)
		}
		return true, fmt.Errorf("%s exited: %w", p.name, p.waitErr)
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group and SIGKILL once grace has passed.
// It returns after the process has exited. An exit caused by the signal is
// not an error; an earlier unexpected exit is.
func (p *process) stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		if done, err := p.exited(); done {
			p.stopErr = err
			return
		}
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		_ = syscall.Kill(-pgid, syscall.SIGCONT) // a paused process handles it
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
		// Whatever the group leader left behind goes too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	return p.stopErr
}

// tail returns the last n lines of the process log.
func (p *process) tail(n int) string { return tailFile(p.logPath, n) }

// tailFile returns the last n lines of the file at path.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", path, err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := 0
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] == '\n' {
			lines++
			if lines == n {
				return string(data[i+1:])
			}
		}
	}
	return string(data)
}

// logContains reports whether the process log contains s.
func (p *process) logContains(s string) bool {
	data, err := os.ReadFile(p.logPath)
	return err == nil && bytes.Contains(data, []byte(s))
}

// errAddrInUse marks a start that lost a port race; the caller retries.
var errAddrInUse = errors.New("address already in use")

// runUntilReady starts a process via start on fresh ports and polls ready
// until it succeeds, the process exits or ctx ends. When the process exits
// because a port was taken meanwhile, it retries with new ports.
func runUntilReady(ctx context.Context, nports int, start func(ports []int) (*process, error), ready func(ctx context.Context, ports []int) error) (*process, []int, error) {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		ports, err := freeport.Ports(nports)
		if err != nil {
			return nil, nil, err
		}
		p, err := start(ports)
		if err != nil {
			return nil, nil, err
		}
		err = waitReady(ctx, p, func(ctx context.Context) error { return ready(ctx, ports) })
		if err == nil {
			return p, ports, nil
		}
		_ = p.stop(time.Second)
		if errors.Is(err, errAddrInUse) && attempt < attempts {
			continue
		}
		return p, ports, err
	}
}

// waitReady polls ready every 100 ms until it returns nil, the process
// exits or ctx ends; the error then names the last readiness failure.
func waitReady(ctx context.Context, p *process, ready func(ctx context.Context) error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if done, err := p.exited(); done {
			if p.logContains("address already in use") {
				return fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return err
		}
		attemptCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = ready(attemptCtx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %v)", p.name, ctx.Err(), last)
		case <-p.done:
		case <-tick.C:
		}
	}
}

func loopbackURL(scheme string, port int) string {
	return scheme + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
