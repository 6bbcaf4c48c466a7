// Package grid runs the grid workload controllers of atoll-cloud on the
// controller-runtime manager of cloud/manager: DeploymentGrid and
// StatefulSetGrid (one Deployment or StatefulSet `<grid>-<unit>` per value
// of the grid's node label key gridUniqKey) and ServiceGrid (one Service
// `<grid>-svc` annotated topology.atoll.io/keys=["<gridUniqKey>"]).
//
// A child is rendered from the unit's template (SuperEdge's templates /
// defaultTemplateName / templatePool, else the grid's template), pinned to
// its unit (nodeSelector[key]=unit merged into the template's; the key
// wins), labeled apps.atoll.io/grid and apps.atoll.io/unit (pods and the
// selector too, so the children of one grid never share pods), changed by
// the overrides that match the unit, in order (replicas, images, env,
// resources, then RFC 6902 patches on the child object, after which its
// identity is restored), and hashed: the hash is the child's
// apps.atoll.io/revision annotation.
//
// Writes: server-side apply (field manager atoll-cloud, forced) of a child
// only when it is missing, its revision differs from the desired one (and
// the rollout lets the unit change), it is an orphan labeled for the grid
// (adopted), or its generation moved since this process applied it (a
// hand edit, undone); a delete when its unit is gone; a merge patch that
// drops the controller reference of a child relabeled away (released); a
// status merge patch only when the status differs. A reconcile where
// nothing changed writes nothing, and a restarted controller trusts the
// revision annotations, so it writes nothing either.
//
// Specs the schema cannot judge (a template name missing from the pool
// under a unit whose label value is not a valid name, a patch that does
// not apply, a container an override names that does not exist, a child
// name taken by another controller) set InvalidSpec=True and record a
// Warning Event; the other units go on, and nothing retries until the
// grid changes.
//
// Rollout: a unit whose child has another revision changes when
// planRollout lets it: canaryUnits first, one at a time, then the rest by
// name, at most spec.rollout.maxUnavailableUnits changing (not yet Ready)
// at once. A unit not Ready within progressDeadlineSeconds of its change
// stops the rollout (Progressing=False, reason ProgressDeadlineExceeded,
// a Warning Event); a new spec.rollout.resume value (`atoll grid resume`)
// lets it pass the stalled units.
//
// Active-active: the controllers run on the leader only (the manager's
// leader election on a Lease, cloud/manager). Server-side apply alone
// would keep two replicas from clobbering each other's fields, but not
// from disagreeing: the rollout decides from the children's readiness and
// time which unit goes next, and two replicas with caches a moment apart
// would each start a unit (exceeding maxUnavailableUnits) and write
// conditions back and forth. One writer at a time avoids both; a new
// leader starts from the children's annotations and the grid's status,
// so it continues where the old one stopped.
package grid
