package webhook

import "errors"

// errNoClient: registration is enabled but the app provides no client.
var errNoClient = errors.New("webhook registration: enabled, but no kubernetes.Interface is provided")
