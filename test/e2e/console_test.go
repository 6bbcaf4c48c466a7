package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/testbed"
)

// consoleShape is the bed of the browser test: the embedded hub, its own
// loopback net.
var consoleShape = hubShape{name: "console", net: 7}

// browser starts headless Chromium (Debian's chromium package: task
// browser:deps) and returns a tab. Without the binary the test is
// skipped locally and fails under CI=true; a browser that does not start
// always fails the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		msg := "no Chromium binary (chromium, chromium-browser, google-chrome or headless-shell) in PATH: run `go tool task browser:deps` (apt-get install chromium)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1400, 900),
		chromedp.UserDataDir(t.TempDir()),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first action starts the browser, which lives as long as the
	// context of that action: the tab's.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("headless Chromium %s does not start: %v", path, err)
	}
	return ctx
}

// pageAttr is the attribute of the first element matching the CSS
// selector sel, "" when there is none.
func pageAttr(ctx context.Context, sel, attr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
		`(function(){const e=document.querySelector(%q); return e ? (e.getAttribute(%q) || "") : ""})()`, sel, attr)))
}

// waitState waits until node's cell on the page has state and returns
// when it saw it.
func waitState(t *testing.T, ctx context.Context, node, state string, within time.Duration) time.Time {
	t.Helper()
	poll.Eventually(t, within, func() error {
		got, err := pageAttr(ctx, fmt.Sprintf(`[data-node=%q].node`, node), "data-state")
		if err != nil {
			return err
		}
		if got != state {
			return fmt.Errorf("the page shows %s as %q, want %q", node, got, state)
		}
		return nil
	})
	return time.Now()
}

// TestConsoleBrowser drives the status page of a running installation
// (real apiserver and KCM, atoll-cloud with the embedded hub, simulated
// sites with real agents) in headless Chromium: the page loads with
// every node; a DeploymentGrid template change shows the new template
// in the unit; a node whose cloud link is cut while its peers see it
// turns "protected" within seconds of the cloud's decision, with the
// votes behind it; a dead node turns "unhealthy".
//
// With ATOLL_UI_SCREENSHOT=<file.png> it writes a screenshot of the
// page in that partition scenario (task ui:screenshot).
func TestConsoleBrowser(t *testing.T) {
	tab := browser(t)
	e := startShape(t, consoleShape, func(o *testbed.Options) { o.Grids = true })
	ctx := t.Context()
	nodes := e.site(t, "p", 4, true)
	e.site(t, "q", 3, false)
	screenshot := os.Getenv("ATOLL_UI_SCREENSHOT")
	if screenshot != "" {
		// A few more sites (without agents: Ready, no verdict) for a
		// picture closer to an installation.
		for _, u := range []string{"r", "s", "t"} {
			e.site(t, u, 8, false)
		}
	}

	url := "http://" + e.bed.Admin.Addr() + "/ui/"
	if err := chromedp.Do(tab, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	for _, n := range append(nodes, "q-1", "q-2", "q-3") {
		waitState(t, tab, n, "healthy", 30*time.Second)
	}
	if conn, err := pageAttr(tab, "#conn", "data-conn"); err != nil || conn != "live" {
		t.Fatalf("event stream %q (%v), want live", conn, err)
	}

	// A grid rollout: v1, then a template change; the unit's row shows
	// the revision the grid's status names.
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(e.bed.Cluster.RESTConfig(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := "console"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	tpl := webTemplate("app:v1", 1)
	tpl.Selector.MatchLabels = map[string]string{"app": "grid"}
	tpl.Template.Labels = map[string]string{"app": "grid"}
	g := &appsv1alpha1.DeploymentGrid{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{Template: tpl}}
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	row := `[data-grid="DeploymentGrid/console/app"][data-unit="p"]`
	// revision is p's child revision in the grid's status once it is
	// Ready with the current template.
	revision := func() (string, error) {
		var cur appsv1alpha1.DeploymentGrid
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), &cur); err != nil {
			return "", err
		}
		updated := cur.Status.Rollout != nil && slices.Contains(cur.Status.Rollout.Updated, "p")
		for _, u := range cur.Status.Units {
			if u.Name == "p" && u.Ready && updated && cur.Status.ObservedGeneration == cur.Generation {
				return u.Revision, nil
			}
		}
		return "", fmt.Errorf("unit p not ready at generation %d: %+v", cur.Generation, cur.Status.Units)
	}
	shows := func(want string) func() error {
		return func() error {
			got, err := pageAttr(tab, row, "data-revision")
			if err != nil {
				return err
			}
			cur, _ := pageAttr(tab, row, "data-current")
			ready, _ := pageAttr(tab, row, "data-ready")
			if got != want || cur != "true" || ready != "true" {
				return fmt.Errorf("the page shows p on revision %q (current %q, ready %q), want %q ready", got, cur, ready, want)
			}
			return nil
		}
	}
	var v1 string
	poll.Eventually(t, 2*time.Minute, func() error {
		var err error
		v1, err = revision()
		return err
	})
	poll.Eventually(t, 30*time.Second, shows(v1))
	patch := `{"spec":{"template":{"template":{"spec":{"containers":[{"name":"web","image":"app:v2"}]}}}}}`
	if err := c.Patch(ctx, g, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	var v2 string
	poll.Eventually(t, 2*time.Minute, func() error {
		var err error
		if v2, err = revision(); err == nil && v2 == v1 {
			err = errors.New("still on the first revision")
		}
		return err
	})
	poll.Eventually(t, 30*time.Second, shows(v2))

	// Cut p-1 from the cloud: its peers still see it. Note when the
	// cloud decides to protect it, then when the page shows it.
	cut, dead := nodes[0], nodes[3]
	var decided atomic.Int64
	watch, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = poll.Until(watch, func(context.Context) error {
			if e.bed.Health.Protected(cut) {
				decided.Store(time.Now().UnixNano())
				return nil
			}
			return errors.New("not protected")
		})
	}()
	e.partition(t, cut)
	shown := waitState(t, tab, cut, "protected", 2*time.Minute)
	at := decided.Load()
	if at == 0 {
		t.Fatalf("the page shows %s protected before the health service protects it", cut)
	}
	if lag := shown.Sub(time.Unix(0, at)); lag > 5*time.Second {
		t.Fatalf("the page showed %s protected %s after the health service decided, want within 5s", cut, lag)
	}
	t.Logf("%s protected: shown %s after the decision", cut, shown.Sub(time.Unix(0, at)).Round(time.Millisecond))
	// Its detail lists the peers whose votes keep it.
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(fmt.Sprintf(`[data-node=%q].node`, cut)))); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		var voters []string
		for _, v := range nodes[1:] {
			if got, err := pageAttr(tab, fmt.Sprintf(`#votes tr[data-voter=%q]`, v), "data-verdict"); err != nil {
				return err
			} else if got == "healthy" {
				voters = append(voters, v)
			}
		}
		if len(voters) < 2 {
			return fmt.Errorf("the detail of %s lists healthy votes from %v, want a majority of %v", cut, voters, nodes[1:])
		}
		return nil
	})
	if kind, err := pageAttr(tab, fmt.Sprintf(`#timeline li[data-kind="protected"][data-node=%q]`, cut), "data-kind"); err != nil || kind != "protected" {
		t.Fatalf("no timeline entry for %s's protection (%v)", cut, err)
	}

	// The filter keeps the protected node alone; a collapsed unit
	// renders no cells.
	filterBy := func(text string) {
		t.Helper()
		_, err := chromedp.Run(tab, chromedp.Evaluate[bool](fmt.Sprintf(
			`(function(){const f=document.getElementById("filter"); f.value=%q; f.dispatchEvent(new Event("input")); return true})()`, text)))
		if err != nil {
			t.Fatal(err)
		}
	}
	filterBy("protected")
	poll.Eventually(t, 10*time.Second, func() error {
		shown, err := chromedp.Run(tab, chromedp.Evaluate[[]string](
			`Array.from(document.querySelectorAll(".unit:not(.hidden) .nodes .node")).map(e => e.dataset.node)`))
		if err != nil {
			return err
		}
		if len(shown) != 1 || shown[0] != cut {
			return fmt.Errorf("filter %q shows %v, want [%s]", "protected", shown, cut)
		}
		return nil
	})
	filterBy("")
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`.unit[data-unit="q"] h3`))); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		cells, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('.unit[data-unit="q"] .node[data-node]').length`))
		if err != nil {
			return err
		}
		if coll, _ := pageAttr(tab, `.unit[data-unit="q"]`, "data-collapsed"); coll != "true" || cells != 0 {
			return fmt.Errorf("unit q collapsed=%q with %d cells, want collapsed and none", coll, cells)
		}
		return nil
	})
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`.unit[data-unit="q"] h3`))); err != nil {
		t.Fatal(err)
	}
	waitState(t, tab, "q-1", "healthy", 10*time.Second)

	// Kill p-4: its peers call it unhealthy.
	e.kill(t, dead)
	waitState(t, tab, dead, "unhealthy", 2*time.Minute)
	if got, err := pageAttr(tab, fmt.Sprintf(`[data-node=%q].node`, cut), "data-state"); err != nil || got != "protected" {
		t.Fatalf("after %s died the page shows %s as %q (%v), want still protected", dead, cut, got, err)
	}

	if out := screenshot; out != "" {
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsAbs(out) {
			t.Fatalf("ATOLL_UI_SCREENSHOT=%s: want an absolute path", out)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", out, len(png))
	}
}
