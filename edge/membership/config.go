package membership

// Config tunes membership. How often its views are caught up with the
// stream is the view feeds' CheckPeriod (edge/viewfeed,
// --view-check-period).
type Config struct {
	// StateDir keeps the last assignment and unit view (empty: nothing is
	// kept and a restart waits for the cloud).
	StateDir string
}
