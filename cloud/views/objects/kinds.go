package objects

import "github.com/atoll-edge/atoll/internal/objectview"

// sharedKinds are the kinds stored in the shared space only.
var sharedKinds = []string{objectview.KindServices, objectview.KindEndpointSlices, objectview.KindEndpoints}
