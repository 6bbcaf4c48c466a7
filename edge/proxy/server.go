package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/internal/objectview"
)

// codecs are the encodings of the served types (JSON, YAML, protobuf),
// with their stream forms for watches.
var codecs = serializer.NewCodecFactory(objectview.Scheme)

// resource is one served resource of the Kubernetes API.
type resource struct {
	kind     string // objectview kind
	group    string
	version  string
	listKind string
	fieldSet func(objectview.Object) fields.Set
	// info overrides the objectview kind's (a resource the views do not
	// carry, served empty).
	info *objectview.Info
}

// kindInfo describes the resource's objects.
func (res resource) kindInfo() objectview.Info {
	if res.info != nil {
		return *res.info
	}
	info, _ := objectview.Kind(res.kind)
	return info
}

// serviceCIDRs is served empty: kube-proxy watches ServiceCIDRs (to
// reject traffic to unallocated ClusterIPs) and waits for the informer;
// the views do not carry them yet.
var serviceCIDRs = &objectview.Info{
	GVK: networkingv1.SchemeGroupVersion.WithKind("ServiceCIDR"),
	New: func() objectview.Object { return &networkingv1.ServiceCIDR{} }, NewList: func() runtime.Object { return &networkingv1.ServiceCIDRList{} },
}

func metaFields(o objectview.Object) fields.Set {
	return fields.Set{"metadata.name": o.GetName(), "metadata.namespace": o.GetNamespace()}
}

var resources = map[string]resource{
	"services": {kind: objectview.KindServices, version: "v1", listKind: "ServiceList", fieldSet: func(o objectview.Object) fields.Set {
		f := metaFields(o)
		if s, ok := o.(*corev1.Service); ok {
			f["spec.clusterIP"] = s.Spec.ClusterIP
			f["spec.type"] = string(s.Spec.Type)
		}
		return f
	}},
	"endpoints":      {kind: objectview.KindEndpoints, version: "v1", listKind: "EndpointsList", fieldSet: metaFields},
	"nodes":          {kind: objectview.KindNodes, version: "v1", listKind: "NodeList", fieldSet: metaFields},
	"servicecidrs":   {kind: "servicecidrs", group: networkingv1.GroupName, version: "v1", listKind: "ServiceCIDRList", fieldSet: metaFields, info: serviceCIDRs},
	"endpointslices": {kind: objectview.KindEndpointSlices, group: discoveryv1.GroupName, version: "v1", listKind: "EndpointSliceList", fieldSet: metaFields},
}

// Server is the endpoints proxy's HTTP API: the read-only slice of the
// Kubernetes API kube-proxy (and kubectl, and client-go informers) use,
// answered from the store.
type Server struct {
	store    *Store
	log      *slog.Logger
	metrics  *metrics
	bookmark time.Duration
}

// NewServer returns the API over store; watches get a bookmark every
// bookmark interval.
func NewServer(store *Store, bookmark time.Duration, log *slog.Logger) *Server {
	return &Server{store: store, log: log, metrics: store.metrics, bookmark: bookmark}
}

// request is a parsed resource request.
type request struct {
	res       resource
	namespace string
	name      string
}

// parse maps a path to a resource request: /api/v1/[namespaces/<ns>/]<res>[/<name>]
// or /apis/<group>/<version>/[namespaces/<ns>/]<res>[/<name>].
func parse(path string) (request, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	var group, ver string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		ver, parts = parts[1], parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, ver, parts = parts[1], parts[2], parts[3:]
	default:
		return request{}, false
	}
	var r request
	if len(parts) >= 3 && parts[0] == "namespaces" {
		r.namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 || len(parts) > 2 {
		return request{}, false
	}
	res, ok := resources[parts[0]]
	if !ok || res.group != group || res.version != ver {
		return request{}, false
	}
	if r.namespace != "" && !res.kindInfo().Namespaced {
		return request{}, false
	}
	r.res = res
	if len(parts) == 2 {
		r.name = parts[1]
	}
	return r, true
}

// ServeHTTP answers discovery, get, list and watch; writes are accepted
// and dropped.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.dropWrite(w, r)
		return
	}
	switch p := strings.TrimSuffix(r.URL.Path, "/"); p {
	case "/healthz", "/livez", "/readyz":
		_, _ = io.WriteString(w, "ok")
		return
	case "/version":
		s.writeJSON(w, "discovery", &version.Info{Major: "1", Minor: "36", GitVersion: "v1.36.0-atoll-proxy", Platform: "linux/amd64"})
		return
	case "/api":
		s.writeJSON(w, "discovery", &metav1.APIVersions{TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host}}})
		return
	case "/apis":
		gv := metav1.GroupVersionForDiscovery{GroupVersion: discoveryv1.SchemeGroupVersion.String(), Version: "v1"}
		ngv := metav1.GroupVersionForDiscovery{GroupVersion: networkingv1.SchemeGroupVersion.String(), Version: "v1"}
		s.writeJSON(w, "discovery", &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"},
			Groups: []metav1.APIGroup{{Name: discoveryv1.GroupName, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv},
				{Name: networkingv1.GroupName, Versions: []metav1.GroupVersionForDiscovery{ngv}, PreferredVersion: ngv}}})
		return
	case "/api/v1", "/apis/" + discoveryv1.SchemeGroupVersion.String(), "/apis/" + networkingv1.SchemeGroupVersion.String():
		s.writeJSON(w, "discovery", resourceList(p))
		return
	case "/apis/" + discoveryv1.GroupName:
		gv := metav1.GroupVersionForDiscovery{GroupVersion: discoveryv1.SchemeGroupVersion.String(), Version: "v1"}
		s.writeJSON(w, "discovery", &metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
			Name: discoveryv1.GroupName, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv})
		return
	}
	req, ok := parse(r.URL.Path)
	if !ok {
		s.writeStatus(w, r, "get", apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
		return
	}
	q := r.URL.Query()
	switch {
	case req.name != "" && q.Get("watch") != "true" && q.Get("watch") != "1":
		s.get(w, r, req)
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		if req.name != "" { // a watch of one object by name
			q.Set("fieldSelector", joinSelector(q.Get("fieldSelector"), "metadata.name="+req.name))
		}
		s.watch(w, r, req, q)
	default:
		s.list(w, r, req, q)
	}
}

func joinSelector(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

// resourceList is the discovery document of one group version.
func resourceList(path string) *metav1.APIResourceList {
	verbs := metav1.Verbs{"get", "list", "watch"}
	l := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}}
	if path == "/api/v1" {
		l.GroupVersion = "v1"
		l.APIResources = []metav1.APIResource{
			{Name: "services", SingularName: "service", Namespaced: true, Kind: "Service", Verbs: verbs, ShortNames: []string{"svc"}},
			{Name: "endpoints", SingularName: "endpoints", Namespaced: true, Kind: "Endpoints", Verbs: verbs, ShortNames: []string{"ep"}},
			{Name: "nodes", SingularName: "node", Kind: "Node", Verbs: verbs, ShortNames: []string{"no"}},
			{Name: "events", SingularName: "event", Namespaced: true, Kind: "Event", Verbs: metav1.Verbs{"create", "patch", "update"}, ShortNames: []string{"ev"}},
		}
		return l
	}
	if path == "/apis/"+networkingv1.SchemeGroupVersion.String() {
		l.GroupVersion = networkingv1.SchemeGroupVersion.String()
		l.APIResources = []metav1.APIResource{{Name: "servicecidrs", SingularName: "servicecidr", Kind: "ServiceCIDR", Verbs: verbs}}
		return l
	}
	l.GroupVersion = discoveryv1.SchemeGroupVersion.String()
	l.APIResources = []metav1.APIResource{{Name: "endpointslices", SingularName: "endpointslice", Namespaced: true, Kind: "EndpointSlice", Verbs: verbs}}
	return l
}

// negotiate picks the encoding of the answer: protobuf when the client
// accepts it before JSON, else JSON (also for Table requests: kubectl
// prints a plain list itself).
func negotiate(r *http.Request) runtime.SerializerInfo {
	want := runtime.ContentTypeJSON
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		if params["as"] != "" { // Table, PartialObjectMetadata: not served
			continue
		}
		if mt == runtime.ContentTypeProtobuf || mt == runtime.ContentTypeJSON || mt == "*/*" || mt == "application/*" {
			if mt == runtime.ContentTypeProtobuf {
				want = mt
			}
			break
		}
	}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), want)
	return info
}

func (s *Server) encoder(info runtime.SerializerInfo, gv schema.GroupVersion) runtime.Encoder {
	return codecs.EncoderForVersion(info.Serializer, gv)
}

func (s *Server) writeJSON(w http.ResponseWriter, verb string, obj any) {
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	var buf bytes.Buffer
	ro, ok := obj.(runtime.Object)
	if !ok {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	if err := info.Serializer.Encode(ro, &buf); err != nil {
		s.log.Error("encode discovery", "err", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	_, _ = w.Write(buf.Bytes())
	s.metrics.requests.WithLabelValues(verb, "200").Inc()
}

func (s *Server) writeStatus(w http.ResponseWriter, r *http.Request, verb string, err error) {
	st := apierrors.APIStatus(apierrors.NewInternalError(err))
	if se, ok := err.(apierrors.APIStatus); ok {
		st = se
	}
	status := st.Status()
	status.Kind, status.APIVersion = "Status", "v1"
	info := negotiate(r)
	var buf bytes.Buffer
	_ = s.encoder(info, metav1.SchemeGroupVersion).Encode(&status, &buf)
	w.Header().Set("Content-Type", info.MediaType)
	w.WriteHeader(int(status.Code))
	_, _ = w.Write(buf.Bytes())
	s.metrics.requests.WithLabelValues(verb, strconv.Itoa(int(status.Code))).Inc()
}

func (s *Server) writeObject(w http.ResponseWriter, r *http.Request, verb string, gv schema.GroupVersion, obj runtime.Object) {
	info := negotiate(r)
	var buf bytes.Buffer
	if err := s.encoder(info, gv).Encode(obj, &buf); err != nil {
		s.writeStatus(w, r, verb, err)
		return
	}
	w.Header().Set("Content-Type", info.MediaType)
	_, _ = w.Write(buf.Bytes())
	s.metrics.requests.WithLabelValues(verb, "200").Inc()
}

func gvOf(res resource) schema.GroupVersion {
	return schema.GroupVersion{Group: res.group, Version: res.version}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, req request) {
	obj, ok := s.store.Get(req.res.kind, req.namespace, req.name)
	if !ok {
		s.writeStatus(w, r, "get", apierrors.NewNotFound(schema.GroupResource{Group: req.res.group, Resource: req.res.kind}, req.name))
		return
	}
	s.writeObject(w, r, "get", gvOf(req.res), obj)
}

// selection parses the namespace and selectors of a list or watch.
func selection(req request, q map[string][]string) (match, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	m := match{namespace: req.namespace, fieldSet: req.res.fieldSet}
	ls, err := labels.Parse(get("labelSelector"))
	if err != nil {
		return m, apierrors.NewBadRequest(fmt.Sprintf("labelSelector: %v", err))
	}
	m.labels = ls
	fs, err := fields.ParseSelector(get("fieldSelector"))
	if err != nil {
		return m, apierrors.NewBadRequest(fmt.Sprintf("fieldSelector: %v", err))
	}
	for _, r := range fs.Requirements() {
		if _, ok := req.res.fieldSet(req.res.sample())[r.Field]; !ok {
			return m, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", r.Field))
		}
	}
	m.fields = fs
	return m, nil
}

func (res resource) sample() objectview.Object {
	return res.kindInfo().New()
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, req request, q map[string][]string) {
	m, err := selection(req, q)
	if err != nil {
		s.writeStatus(w, r, "list", err)
		return
	}
	objs, rev := s.store.List(req.res.kind, m)
	if rv := first(q, "resourceVersion"); rv != "" && rv != "0" {
		want, err := strconv.ParseUint(rv, 10, 64)
		switch {
		case err != nil:
			s.writeStatus(w, r, "list", apierrors.NewBadRequest("resourceVersion: not a number"))
			return
		case first(q, "resourceVersionMatch") == string(metav1.ResourceVersionMatchExact) && want != rev,
			want > rev:
			// Only the current state is held: an exact older revision,
			// or a newer one than the proxy knows, cannot be listed.
			s.metrics.gone.Inc()
			s.writeStatus(w, r, "list", apierrors.NewResourceExpired(fmt.Sprintf("resourceVersion %d not held; current is %d", want, rev)))
			return
		}
	}
	list := req.res.kindInfo().NewList()
	items := make([]runtime.Object, len(objs))
	for i, o := range objs {
		items[i] = o
	}
	if err := meta.SetList(list, items); err != nil {
		s.writeStatus(w, r, "list", err)
		return
	}
	lm, _ := meta.ListAccessor(list)
	lm.SetResourceVersion(strconv.FormatUint(rev, 10))
	s.writeObject(w, r, "list", gvOf(req.res), list)
}

func first(q map[string][]string, k string) string {
	if v := q[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// initialEventsEnd is the annotation of the bookmark ending a watch
// list's initial events.
const initialEventsEnd = "k8s.io/initial-events-end"

func (s *Server) watch(w http.ResponseWriter, r *http.Request, req request, q map[string][]string) {
	m, err := selection(req, q)
	if err != nil {
		s.writeStatus(w, r, "watch", err)
		return
	}
	rv := first(q, "resourceVersion")
	sendInitial := first(q, "sendInitialEvents") == "true"
	initial := sendInitial || rv == "" || rv == "0"
	var from uint64
	if !initial {
		if from, err = strconv.ParseUint(rv, 10, 64); err != nil {
			s.writeStatus(w, r, "watch", apierrors.NewBadRequest("resourceVersion: not a number"))
			return
		}
	}
	bookmarks := first(q, "allowWatchBookmarks") == "true"
	timeout := 30 * time.Minute
	if t, err := strconv.Atoi(first(q, "timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()

	info := negotiate(r)
	stream := info.StreamSerializer
	if stream == nil {
		s.writeStatus(w, r, "watch", apierrors.NewBadRequest("no stream encoding for "+info.MediaType))
		return
	}
	gv := gvOf(req.res)
	embedded := s.encoder(info, gv)
	flusher, _ := w.(http.Flusher)
	ct := info.MediaType
	if ct == runtime.ContentTypeProtobuf {
		ct += ";stream=watch"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	enc := streaming.NewEncoder(stream.Framer.NewFrameWriter(countingWriter{w, s.metrics.eventBytes}), stream.Serializer)
	send := func(t watch.EventType, obj runtime.Object) error {
		var buf bytes.Buffer
		if err := embedded.Encode(obj, &buf); err != nil {
			return err
		}
		if err := enc.Encode(&metav1.WatchEvent{Type: string(t), Object: runtime.RawExtension{Raw: buf.Bytes()}}); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	bookmarkAt := func(rev uint64, end bool) error {
		o := req.res.sample()
		o.SetResourceVersion(strconv.FormatUint(rev, 10))
		if end {
			o.SetAnnotations(map[string]string{initialEventsEnd: "true"})
		}
		return send(watch.Bookmark, o)
	}

	backlog, rev, ch, stop, err := s.store.Watch(req.res.kind, m, from, initial)
	if err != nil {
		st := apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d", from)).Status()
		st.Kind, st.APIVersion = "Status", "v1"
		_ = send(watch.Error, &st)
		s.metrics.requests.WithLabelValues("watch", "410").Inc()
		return
	}
	defer stop()
	s.metrics.requests.WithLabelValues("watch", "200").Inc()
	for _, ev := range backlog {
		if err := send(ev.Type, ev.Obj); err != nil {
			return
		}
	}
	if sendInitial && bookmarks {
		if err := bookmarkAt(rev, true); err != nil {
			return
		}
	}
	last := rev
	tick := time.NewTicker(s.bookmark)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return // fell behind: the client resumes from its last revision
			}
			if err := send(ev.Type, ev.Obj); err != nil {
				return
			}
			last = ev.RV
		case <-tick.C:
			if bookmarks {
				if cur := s.store.Rev(); cur > last {
					last = cur
				}
				if err := bookmarkAt(last, false); err != nil {
					return
				}
			}
		}
	}
}

// dropWrite accepts a write (kube-proxy's events, a status update) and
// drops it: the edge holds no Kubernetes credentials and forwards
// nothing. The body is echoed back as the created object, so clients
// decode a valid answer and never retry.
func (s *Server) dropWrite(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	res := "unknown"
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			res = parts[i+2]
			break
		}
		if i == len(parts)-1 {
			res = p
		}
	}
	s.metrics.writes.WithLabelValues(res).Inc()
	ct := r.Header.Get("Content-Type")
	if ct == "" || len(body) == 0 || strings.HasPrefix(ct, "application/apply-patch") || strings.Contains(ct, "patch") {
		// A patch's body is no object: answer an empty object of the
		// request's kind is not known; a Status is safe to decode.
		st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: http.StatusOK}
		s.writeObject(w, r, "write", metav1.SchemeGroupVersion, &st)
		return
	}
	w.Header().Set("Content-Type", ct)
	code := http.StatusOK
	if r.Method == http.MethodPost {
		code = http.StatusCreated
	}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n prometheus.Counter
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(float64(n))
	return n, err
}
