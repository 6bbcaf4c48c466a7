package grid

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Longest child names: a Deployment name is a DNS subdomain; a
// StatefulSet's must leave room for its controller-revision-hash label
// (`<name>-<hash of 10>` is a label value of at most 63 characters); a
// Service's is a DNS label.
const (
	maxDeploymentName  = validation.DNS1123SubdomainMaxLength
	maxStatefulSetName = 52
	maxServiceName     = validation.DNS1123LabelMaxLength
)

// ServiceSuffix ends the name of a ServiceGrid's Service.
const ServiceSuffix = "-svc"

// ChildName is the name of a grid's child in unit: `<grid>-<unit>`.
func ChildName(grid, unit string) string { return grid + "-" + unit }

// ServiceName is the name of a ServiceGrid's Service: `<grid>-svc`.
func ServiceName(grid string) string { return grid + ServiceSuffix }

// checkChildName says why name cannot name a child of kind (Deployment or
// StatefulSet), or nil.
func checkChildName(kind, name string) error {
	limit := maxDeploymentName
	if kind == kindStatefulSet {
		limit = maxStatefulSetName
	}
	if len(name) > limit {
		return fmt.Errorf("%s name %q is %d characters, more than %d", kind, name, len(name), limit)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%s name %q: %s", kind, name, strings.Join(errs, "; "))
	}
	if kind == kindStatefulSet {
		// Its pods' hostnames are `<name>-<ordinal>`: DNS labels.
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			return fmt.Errorf("%s name %q: %s", kind, name, strings.Join(errs, "; "))
		}
	}
	return nil
}
