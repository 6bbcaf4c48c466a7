package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/internal/cliflags"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// gridFlags are the flags of the grid commands: where the grid is.
type gridFlags struct {
	kubeconfig, namespace, kind string
}

func (f *gridFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&f.namespace, "n", "default", "namespace of the grid")
	fs.StringVar(&f.kind, "kind", "dg", "kind of the grid: dg (DeploymentGrid) or ssg (StatefulSetGrid)")
}

// get reads the grid name.
func (f *gridFlags) get(ctx context.Context, c client.Client, name string) (client.Object, *appsv1alpha1.GridStatus, error) {
	key := types.NamespacedName{Namespace: f.namespace, Name: name}
	switch f.kind {
	case "dg", "deploymentgrid":
		var g appsv1alpha1.DeploymentGrid
		if err := c.Get(ctx, key, &g); err != nil {
			return nil, nil, err
		}
		return &g, &g.Status, nil
	case "ssg", "statefulsetgrid":
		var g appsv1alpha1.StatefulSetGrid
		if err := c.Get(ctx, key, &g); err != nil {
			return nil, nil, err
		}
		return &g, &g.Status, nil
	}
	return nil, nil, cliflags.Usagef("--kind %q: want dg or ssg", f.kind)
}

// client connects to the cluster of the kubeconfig.
func (f *gridFlags) client() (client.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(rc, client.Options{Scheme: scheme})
}

// gridCommand parses a grid command's flags (and extra's, if not nil)
// and its one argument.
func gridCommand(name string, args []string, stdout io.Writer, extra func(*flag.FlagSet) string) (*gridFlags, string, error) {
	fs := flag.NewFlagSet("atoll grid "+name, flag.ContinueOnError)
	var gf gridFlags
	gf.register(fs)
	more := ""
	if extra != nil {
		more = extra(fs)
	}
	if err := parseFlags(fs, args, stdout, "atoll grid "+name+" [-n NAMESPACE] [--kind dg|ssg] [--kubeconfig F]"+more+" NAME"); err != nil {
		return nil, "", err
	}
	if fs.NArg() != 1 {
		return nil, "", cliflags.UsageError{Err: errors.New("grid " + name + ": give exactly one grid name"), Cmd: fs.Name()}
	}
	return &gf, fs.Arg(0), nil
}

// gridResume continues a rollout stopped at a unit's progress deadline:
// it sets spec.rollout.resume to the current time (a value it never
// held), which makes the controller pass the stalled units.
func gridResume(ctx context.Context, args []string, stdout io.Writer) error {
	gf, name, err := gridCommand("resume", args, stdout, nil)
	if err != nil {
		return err
	}
	c, err := gf.client()
	if err != nil {
		return err
	}
	g, _, err := gf.get(ctx, c, name)
	if err != nil {
		return fmt.Errorf("grid resume: %w", err)
	}
	token := time.Now().UTC().Format(time.RFC3339Nano)
	patch := fmt.Sprintf(`{"spec":{"rollout":{"resume":%q}}}`, token)
	if err := c.Patch(ctx, g, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return fmt.Errorf("grid resume: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "%s/%s: rollout resumed (spec.rollout.resume=%s)\n", gf.namespace, name, token)
	return err
}

// gridStatus prints a grid's units and its rollout position.
func gridStatus(ctx context.Context, args []string, stdout io.Writer) error {
	out := &outputFlag{accepted: []string{"json", "yaml"}}
	gf, name, err := gridCommand("status", args, stdout, func(fs *flag.FlagSet) string {
		fs.Var(out, "o", "output `format`: json or yaml (the whole grid object); default: the units table, the rollout and the conditions")
		fs.Var(out, "output", "same as -o `format`")
		return " [-o json|yaml]"
	})
	if err != nil {
		return err
	}
	c, err := gf.client()
	if err != nil {
		return err
	}
	g, st, err := gf.get(ctx, c, name)
	if err != nil {
		return fmt.Errorf("grid status: %w", err)
	}
	if out.value != "" {
		return printObject(stdout, g, out.value)
	}
	return printGridStatus(stdout, g, st)
}

// printObject writes a grid object as JSON or YAML, with its apiVersion
// and kind (the typed client leaves them empty), without managedFields.
func printObject(w io.Writer, g client.Object, output string) error {
	kind := "DeploymentGrid"
	if _, ok := g.(*appsv1alpha1.StatefulSetGrid); ok {
		kind = "StatefulSetGrid"
	}
	g.GetObjectKind().SetGroupVersionKind(appsv1alpha1.GroupVersion.WithKind(kind))
	g.SetManagedFields(nil) // as kubectl get prints it
	b, err := json.MarshalIndent(g, "", "  ")
	if err == nil && output == "yaml" {
		b, err = yaml.JSONToYAML(b)
	} else {
		b = append(b, '\n')
	}
	if err != nil {
		return fmt.Errorf("grid status: encode %s: %w", output, err)
	}
	_, err = w.Write(b)
	return err
}

// printGridStatus writes the per-unit table, the rollout and the
// conditions.
func printGridStatus(w io.Writer, g client.Object, st *appsv1alpha1.GridStatus) error {
	fmt.Fprintf(w, "%s/%s: %d/%d units ready (generation %d, observed %d)\n", g.GetNamespace(), g.GetName(), st.ReadyUnits, st.UnitCount, g.GetGeneration(), st.ObservedGeneration)
	rev := ""
	if st.Rollout != nil {
		rev = st.Rollout.Revision
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UNIT\tCHILD\tREADY\tREPLICAS\tUPDATED\tAVAILABLE\tROLLOUT")
	for _, u := range st.Units {
		ready := "-"
		if u.Ready {
			ready = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\n", u.Name, u.Child, ready, u.ReadyReplicas, u.Replicas, u.UpdatedReplicas, u.AvailableReplicas, rolloutPosition(st.Rollout, u.Name))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.Rollout != nil {
		fmt.Fprintf(w, "rollout %s: updated %s; pending %s; stalled %s; skipped %s\n", rev,
			list(st.Rollout.Updated), list(st.Rollout.Pending), list(st.Rollout.Stalled), list(st.Rollout.Skipped))
	}
	for _, t := range []string{appsv1alpha1.ConditionReady, appsv1alpha1.ConditionProgressing, appsv1alpha1.ConditionInvalid} {
		if c := meta.FindStatusCondition(st.Conditions, t); c != nil {
			fmt.Fprintf(w, "%s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	return nil
}

// rolloutPosition is a unit's place in the rollout.
func rolloutPosition(r *appsv1alpha1.RolloutStatus, unit string) string {
	if r == nil {
		return "-"
	}
	for _, p := range []struct {
		name  string
		units []string
	}{{"stalled", r.Stalled}, {"skipped", r.Skipped}, {"pending", r.Pending}, {"updated", r.Updated}} {
		for _, u := range p.units {
			if u == unit {
				return p.name
			}
		}
	}
	return "-"
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
