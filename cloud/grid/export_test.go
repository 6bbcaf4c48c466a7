package grid

// ProblemRecheck is how often a unit that is not ready is looked at again.
const ProblemRecheck = problemRecheck
