package grid

import (
	"errors"
	"fmt"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Modes of Config.Mode.
const (
	// ModeAuto runs the grid controllers when the apps.atoll.io CRDs are
	// served at start, and logs that grids are off otherwise.
	ModeAuto = "auto"
	// ModeOn requires the CRDs: atoll-cloud fails to start without them.
	ModeOn = "on"
	// ModeOff never runs the grid controllers.
	ModeOff = "off"
)

// Config configures the grid controllers.
type Config struct {
	// Mode is auto, on or off (see ModeAuto).
	Mode string
	// UnitLabel is the node label of the topology's units: the default
	// gridUniqKey, the NodeUnits' key, and the key whose unit changes
	// come as hub events (cloud/views/members's unit lifecycle events).
	UnitLabel string
	// Workers is the number of concurrent reconciles per controller.
	Workers int
	// Resync re-reconciles every grid this often (0: never; the children
	// and unit events drive the controllers).
	Resync time.Duration
	// QPS and Burst limit the controllers' writes, on a client of their
	// own: a grid of 20 units writes 20 children at once, and 200 such
	// grids created together should not wait on the main client's
	// budget (leader election, cache, topology) nor hold it up. The
	// apiserver's priority and fairness still shares it with the others.
	QPS   float32
	Burst int
}

// DefaultConfig runs the controllers when the CRDs exist, resyncs every
// 10 minutes, writes up to 500/s (bursts of 1000).
func DefaultConfig() Config {
	return Config{Mode: ModeAuto, UnitLabel: wellknown.LabelUnit, Workers: 4, Resync: 10 * time.Minute, QPS: 500, Burst: 1000}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Mode != ModeAuto && c.Mode != ModeOn && c.Mode != ModeOff:
		return fmt.Errorf("grid: mode %q: want auto, on or off", c.Mode)
	case c.UnitLabel == "":
		return errors.New("grid: unit label is empty")
	case c.Workers < 1:
		return fmt.Errorf("grid: workers %d: want at least 1", c.Workers)
	case c.Resync < 0:
		return fmt.Errorf("grid: resync %s must not be negative", c.Resync)
	case c.QPS <= 0 || c.Burst < 1:
		return fmt.Errorf("grid: QPS %g and burst %d must be positive", c.QPS, c.Burst)
	}
	return nil
}
