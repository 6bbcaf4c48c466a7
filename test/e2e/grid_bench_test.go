package e2e

import (
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/poll"
)

// benchInt reads an integer knob of a benchmark, at least least.
func benchInt(b *testing.B, name string, def, least int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < least {
			b.Fatalf("%s=%q: want an integer of at least %d", name, v, least)
		}
		return n
	}
	return def
}

// benchDuration reads a positive duration knob of a benchmark.
func benchDuration(b *testing.B, name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("%s=%q: want a positive duration", name, v)
		}
		return d
	}
	return def
}

// BenchmarkGrids measures the grid controllers against the real apiserver
// (with KCM, scheduler and simulated nodes, atoll-cloud as its
// ServiceAccount): ATOLL_BENCH_GRIDS DeploymentGrids (default 200) over
// ATOLL_BENCH_UNITS units of one node (default 20), children of
// ATOLL_BENCH_REPLICAS replicas (default 0: the Deployments alone, no
// pods), created at once. It reports the time until every grid's status
// shows every unit Ready at the current generation, atoll-cloud's writes
// of grid objects per second until then (the apiserver's audit log), and
// its writes in the ATOLL_BENCH_STEADY that follow (default 5m; target
// 0), in which the controllers' periodic resync (ATOLL_BENCH_RESYNC,
// default 1m) reconciles every grid again. It also reports the CPU time
// used until convergence by etcd and kube-apiserver together, by KCM,
// and by this process (atoll-cloud with the grid controllers, the hub's
// three servers, the simulated nodes), and this process's in the steady
// period; the log splits the writes by resource.
//
//	go test -run '^$' -bench Grids -benchtime 1x -timeout 60m ./test/e2e/
func BenchmarkGrids(b *testing.B) {
	grids := benchInt(b, "ATOLL_BENCH_GRIDS", 200, 1)
	units := benchInt(b, "ATOLL_BENCH_UNITS", 20, 1)
	replicas := benchInt(b, "ATOLL_BENCH_REPLICAS", 0, 0)
	steady := benchDuration(b, "ATOLL_BENCH_STEADY", 5*time.Minute)
	resync := benchDuration(b, "ATOLL_BENCH_RESYNC", time.Minute)
	for b.Loop() {
		e := startGrids(b, resync)
		ctx := b.Context()
		ns := "bench"
		if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		var specs []edgesim.NodeSpec
		for u := range units {
			specs = append(specs, edgesim.NodeSpec{Name: fmt.Sprintf("u%d-1", u), Labels: map[string]string{wellknown.LabelUnit: fmt.Sprintf("u%d", u)}})
		}
		if err := e.bed.Kubelet.AddNodes(ctx, specs...); err != nil {
			b.Fatal(err)
		}
		before, err := e.gridWrites()
		if err != nil {
			b.Fatal(err)
		}
		cpu0, self0 := e.bed.Cluster.CPU(), selfCPU()
		start := time.Now()
		for i := range grids {
			g := &appsv1alpha1.DeploymentGrid{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("g%d", i), Namespace: ns},
				Spec:       appsv1alpha1.DeploymentGridSpec{Template: webTemplate("web:v1", int32(replicas))},
			}
			if err := e.c.Create(ctx, g); err != nil {
				b.Fatal(err)
			}
		}
		poll.Eventually(b, 30*time.Minute, func() error {
			var list appsv1alpha1.DeploymentGridList
			if err := e.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
				return err
			}
			done := 0
			for _, g := range list.Items {
				if g.Status.ObservedGeneration == g.Generation && int(g.Status.ReadyUnits) == units {
					done++
				}
			}
			if done < grids {
				return fmt.Errorf("%d/%d grids converged", done, grids)
			}
			return nil
		})
		converge := time.Since(start)
		cpu1, self1 := e.bed.Cluster.CPU(), selfCPU()
		total := func() int {
			w, err := e.gridWrites()
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for k, v := range w {
				n += v - before[k]
			}
			return n
		}
		converged := total()
		settled, _ := e.gridWrites()
		byResource := map[string]int{}
		for k, v := range settled {
			res, _, _ := strings.Cut(k, "/")
			byResource[res] += v - before[k]
		}
		selfSettled := selfCPU()
		time.Sleep(steady) // measuring what happens in a quiet period, not waiting for a state
		after, _ := e.gridWrites()
		selfSteady := selfCPU() - selfSettled
		steadyWrites := 0
		for k, v := range after {
			steadyWrites += v - settled[k]
		}
		b.ReportMetric(converge.Seconds(), "converge-s")
		b.ReportMetric(float64(converged)/converge.Seconds(), "writes/s")
		b.ReportMetric(float64(steadyWrites), "steady-writes")
		b.ReportMetric((cpu1["etcd"] + cpu1["kube-apiserver"] - cpu0["etcd"] - cpu0["kube-apiserver"]).Seconds(), "apiserver-etcd-cpu-s")
		b.ReportMetric((cpu1["kube-controller-manager"] - cpu0["kube-controller-manager"]).Seconds(), "kcm-cpu-s")
		b.ReportMetric((self1 - self0).Seconds(), "process-cpu-s")
		b.ReportMetric(selfSteady.Seconds(), "steady-process-cpu-s")
		b.Logf("writes until convergence by resource: %v", byResource)
		b.Logf("%d grids x %d units (%d children, %d replicas each): converged in %v with %d writes (%.0f/s); %d writes in the %v after, with a resync every %v (objects changed: %d)",
			grids, units, grids*units, replicas, converge.Round(time.Millisecond), converged, float64(converged)/converge.Seconds(), steadyWrites, steady, resync, len(changed(settled, after)))
	}
}

// changed lists the objects whose write count moved.
func changed(a, b map[string]int) []string {
	var out []string
	for k := range maps.Keys(b) {
		if a[k] != b[k] {
			out = append(out, k)
		}
	}
	return out
}

// selfCPU is the CPU time (user and system) this process used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
