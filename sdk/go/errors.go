package triplane

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of Error. The graph kinds are the op table's (and the server's 400s); the others
// are the REST API's error kinds (docs/runtime.md) and the client's own.
const (
	KindGraph             = "graph"
	KindShape             = "shape"
	KindDType             = "dtype"
	KindAttr              = "attr"
	KindLimit             = "limit"
	KindUnknownOp         = "unknown_op"
	KindNotDifferentiable = "not_differentiable"
	KindRequest           = "request"
	KindUnauthorized      = "unauthorized"
	KindForbidden         = "forbidden"
	KindNotFound          = "not_found"
	KindConflict          = "conflict"
	KindNotReady          = "not_ready"
	KindUnavailable       = "unavailable"
	KindConnection        = "connection" // the scheduler could not be reached (after the retries)
	KindCancelled         = "cancelled"  // the job was cancelled (by a cancelled context, or on the cluster)
	KindJobFailed         = "job_failed" // the job failed on the cluster (Error.Cause holds the server's kind)
	KindConfig            = "config"     // no cluster to connect to
	KindInternal          = "internal"
)

// Error is every error the SDK returns. Kind is machine-readable; Message is the server's
// (or the op table's) text; Node and Op name the graph node when the error is about one;
// Loc is the caller's file:line that made that node. errors.Is(err, ErrShape) and the like
// match on Kind; errors.As(err, &e) gives the fields.
type Error struct {
	Kind    string
	Message string
	Node    string
	Op      string
	Loc     string
	Status  int    // HTTP status of a server error (0 otherwise)
	Job     string // the job it is about, if any
	Reason  string // for KindJobFailed: the server's kind of the failure ("user", ...)
	Err     error  // the underlying error (a network error, a context error), if any
}

func (e *Error) Error() string {
	msg := e.Message
	if e.Kind == KindJobFailed && e.Job != "" {
		msg = fmt.Sprintf("job %s failed: %s", e.Job, e.Message)
		if e.Node != "" {
			msg += fmt.Sprintf(" (node %q)", e.Node)
		}
	}
	if e.Loc != "" && !strings.Contains(msg, e.Loc) {
		msg += " (at " + e.Loc + ")"
	}
	return fmt.Sprintf("triplane: %s: %s", e.Kind, msg)
}

// Unwrap gives the underlying error (context.Canceled, a *net.OpError...).
func (e *Error) Unwrap() error { return e.Err }

// Is matches a sentinel of the same Kind (ErrShape, ErrUnauthorized, ...).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Kind == e.Kind
}

// Sentinels for errors.Is.
var (
	ErrGraph             = &Error{Kind: KindGraph}
	ErrShape             = &Error{Kind: KindShape}
	ErrDType             = &Error{Kind: KindDType}
	ErrAttr              = &Error{Kind: KindAttr}
	ErrLimit             = &Error{Kind: KindLimit}
	ErrUnknownOp         = &Error{Kind: KindUnknownOp}
	ErrNotDifferentiable = &Error{Kind: KindNotDifferentiable}
	ErrRequest           = &Error{Kind: KindRequest}
	ErrUnauthorized      = &Error{Kind: KindUnauthorized}
	ErrForbidden         = &Error{Kind: KindForbidden}
	ErrNotFound          = &Error{Kind: KindNotFound}
	ErrConflict          = &Error{Kind: KindConflict}
	ErrNotReady          = &Error{Kind: KindNotReady}
	ErrUnavailable       = &Error{Kind: KindUnavailable}
	ErrConnection        = &Error{Kind: KindConnection}
	ErrCancelled         = &Error{Kind: KindCancelled}
	ErrJobFailed         = &Error{Kind: KindJobFailed}
	ErrConfig            = &Error{Kind: KindConfig}
)

func newError(kind, msg string) *Error { return &Error{Kind: kind, Message: msg} }

// kindOf is the Kind of err, or "" when it is no *Error.
func kindOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}
