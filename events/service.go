package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
)

// CloudService is the nats micro service of atoll-cloud's request/reply
// endpoints (`nats micro ls` lists it). Its replicas answer in the queue
// group of the same name, so one of them answers each request.
const CloudService = "atoll-cloud"

// TunnelService is the nats micro service of atoll-cloud's connections
// from nodes to kube-apiserver (APIServerDialFamily): each replica started
// with --tunnel-apiserver is an instance, in the queue group of the same
// name.
const TunnelService = "atoll-tunnel"

// CloudServiceVersion is the micro version of CloudService: bump it when
// an endpoint's request or reply changes incompatibly.
const CloudServiceVersion = "1.0.0"

// Service error codes of Atoll endpoints (the Nats-Service-Error-Code header).
const (
	CodeBadRequest  = 400
	CodeTooMany     = 429
	CodeInternal    = 500
	CodeUnavailable = 503
)

// ServiceError is the typed error of a micro endpoint: the
// Nats-Service-Error-Code and Nats-Service-Error headers of a reply.
type ServiceError struct {
	Code        int
	Description string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("%s (code %d)", e.Description, e.Code)
}

// ReplyError is the *ServiceError that reply carries, or nil.
func ReplyError(reply *nats.Msg) error {
	desc := reply.Header.Get(micro.ErrorHeader)
	code := reply.Header.Get(micro.ErrorCodeHeader)
	if desc == "" && code == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		n = CodeInternal
	}
	return &ServiceError{Code: n, Description: desc}
}

// Request sends req to the request/reply endpoint on subject and decodes
// the answer into reply. It fails with an error wrapping
// nats.ErrNoResponders when nobody serves the endpoint, ctx's error when
// nobody answers in time, a *ServiceError when the endpoint answers with
// one, or a decode error (ErrTypeMismatch, ErrUndecodable).
func Request(ctx context.Context, nc *nats.Conn, subject string, req, reply proto.Message) error {
	msg, err := NewMsg(subject, req, "")
	if err != nil {
		return err
	}
	out, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	if err := ReplyError(out); err != nil {
		return err
	}
	if err := DecodeMsg(out, reply); err != nil {
		return fmt.Errorf("reply on %s: %w", subject, err)
	}
	return nil
}

// Endpoint adapts h to a micro endpoint handler: the request is decoded as
// PM (a bad one is answered with CodeBadRequest), h's reply is sent with
// Atoll's headers, and h's error is sent as a typed error (its code when
// it is a *ServiceError, CodeInternal otherwise). Every request is
// answered; bad requests are logged at WARN, other errors at ERROR.
func Endpoint[M any, PM interface {
	*M
	proto.Message
}](log *slog.Logger, h func(ctx context.Context, req PM) (proto.Message, error)) micro.Handler {
	if log == nil {
		log = slog.Default()
	}
	return micro.HandlerFunc(func(r micro.Request) {
		req := PM(new(M))
		msg := &nats.Msg{Subject: r.Subject(), Header: nats.Header(r.Headers()), Data: r.Data()}
		if err := DecodeMsg(msg, req); err != nil {
			log.Warn("bad request", "subject", r.Subject(), "bytes", len(r.Data()), "err", err)
			respondError(r, &ServiceError{Code: CodeBadRequest, Description: err.Error()})
			return
		}
		reply, err := h(context.Background(), req)
		if err == nil {
			var out *nats.Msg
			if out, err = NewMsg(r.Reply(), reply, ""); err == nil {
				// An error here means the requester is gone: nobody to answer.
				_ = r.Respond(out.Data, micro.WithHeaders(micro.Headers(out.Header)))
				return
			}
		}
		var se *ServiceError
		if !errors.As(err, &se) {
			se = &ServiceError{Code: CodeInternal, Description: err.Error()}
		}
		log.Error("request failed", "subject", r.Subject(), "code", se.Code, "err", err)
		respondError(r, se)
	})
}

func respondError(r micro.Request, e *ServiceError) {
	_ = r.Error(strconv.Itoa(e.Code), e.Description, nil)
}
