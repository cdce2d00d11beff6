package triplane

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// SubmitOption configures a submit.
type SubmitOption func(*submitArgs)

type submitArgs struct {
	gradOf   *Tensor
	gradWrt  []*Tensor
	deadline time.Duration
}

// WithGrad asks the scheduler for d of / d w for each w (the server's grad request,
// proto/README.md): fetched as "grad:<w's node id>" (Job.FetchGrad) and readable by
// later jobs by ref (Job.GradRef). of must be a floating-point scalar.
func WithGrad(of *Tensor, wrt ...*Tensor) SubmitOption {
	return func(s *submitArgs) { s.gradOf, s.gradWrt = of, wrt }
}

// WithDeadline fails the job on the cluster (kind "deadline") when it has not ended d
// after its submit.
func WithDeadline(d time.Duration) SubmitOption { return func(s *submitArgs) { s.deadline = d } }

// Job is a submitted graph.
type Job struct {
	ID    string
	Plan  string // the canonical graph's hash
	c     *Client
	graph *Graph
	fetch []*Tensor
	wrt   []*Tensor
}

// Status is what GET /v1/jobs/{id} says of a job.
type Status struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Progress struct {
		Done  int `json:"done"`
		Total int `json:"total"`
	} `json:"progress"`
	Error *struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
		Node    string `json:"node"`
		Op      string `json:"op"`
	} `json:"error"`
}

// Terminal reports whether the job has ended (done, failed or cancelled).
func (s *Status) Terminal() bool {
	return s.State == "done" || s.State == "failed" || s.State == "cancelled"
}

// Submit sends the graph of the fetched tensors (and the grad request) to the scheduler
// (POST /v1/jobs). Every node travels with its shape, dtype and loc (the caller's
// file:line), so a server-side error names the line that made the node.
func (c *Client) Submit(ctx context.Context, fetch []*Tensor, opts ...SubmitOption) (*Job, error) {
	var s submitArgs
	for _, o := range opts {
		o(&s)
	}
	outputs := append([]*Tensor{}, fetch...)
	if s.gradOf != nil {
		outputs = append(outputs, s.gradOf)
	}
	g, err := NewGraph(outputs)
	if err != nil {
		return nil, err
	}
	g.outputs = fetch
	fetchNames := make([]string, len(fetch))
	for i, t := range fetch {
		fetchNames[i] = g.ids[t]
	}
	body := map[string]any{"graph": g.wire(), "fetch": fetchNames}
	if s.gradOf != nil {
		wrt := make([]string, len(s.gradWrt))
		for i, w := range s.gradWrt {
			if w == nil || g.ids[w] == "" {
				return nil, newError(KindGraph, fmt.Sprintf("grad: wrt %d is not a node the graph reads", i))
			}
			wrt[i] = g.ids[w]
		}
		body["grad"] = map[string]any{"of": g.ids[s.gradOf], "wrt": wrt}
	}
	if s.deadline > 0 {
		body["deadline_s"] = s.deadline.Seconds()
	}
	doc, err := CanonicalJSON(body)
	if err != nil {
		return nil, err
	}
	r, err := c.do(ctx, http.MethodPost, "/v1/jobs", doc, map[string]string{"Content-Type": "application/json"})
	if err != nil {
		var e *Error
		if asError(err, &e) && e.Node != "" {
			if t := g.byID[e.Node]; t != nil && e.Loc == "" {
				e.Loc = t.loc
			}
		}
		return nil, err
	}
	var out struct {
		ID   string `json:"id"`
		Plan string `json:"plan"`
	}
	if err := decodeInto(r.body, &out); err != nil {
		return nil, err
	}
	return &Job{ID: out.ID, Plan: out.Plan, c: c, graph: g, fetch: fetch, wrt: s.gradWrt}, nil
}

// Graph is the graph the job ran (with its node ids).
func (j *Job) Graph() *Graph { return j.graph }

// Name is the fetched name of t in this job ("" when t was not fetched).
func (j *Job) Name(t *Tensor) string {
	for _, f := range j.fetch {
		if f == t {
			return j.graph.ids[t]
		}
	}
	return ""
}

// GradName is the fetched name of the gradient with respect to w: "grad:<w's node id>".
func (j *Job) GradName(w *Tensor) string {
	for _, x := range j.wrt {
		if x == w {
			return "grad:" + j.graph.ids[w]
		}
	}
	return ""
}

// Status asks the scheduler for the job's state (GET /v1/jobs/{id}).
func (j *Job) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, j.c.getJSON(ctx, "/v1/jobs/"+url.PathEscape(j.ID), &s)
}

// Wait blocks until the job ends (long polls of GET /v1/jobs/{id}/wait). A job that
// failed gives an *Error of kind job_failed with the server's message, node and op (its
// kind in Reason); a cancelled job, kind cancelled. When ctx is cancelled or passes its
// deadline first, the job is cancelled on the cluster (DELETE /v1/jobs/{id}) and Wait
// returns an *Error of kind cancelled wrapping ctx.Err().
func (j *Job) Wait(ctx context.Context) error {
	for {
		poll := 10.0
		if d, ok := ctx.Deadline(); ok {
			if left := time.Until(d).Seconds(); left < poll {
				poll = left
			}
			if poll < 0 {
				poll = 0
			}
		}
		var s Status
		err := j.c.getJSON(ctx, "/v1/jobs/"+url.PathEscape(j.ID)+"/wait?timeout="+strconv.FormatFloat(poll, 'f', 3, 64), &s)
		if ctx.Err() != nil {
			return j.abandon(ctx)
		}
		if err != nil {
			return err
		}
		switch s.State {
		case "done":
			return nil
		case "failed":
			e := &Error{Kind: KindJobFailed, Job: j.ID}
			if s.Error != nil {
				e.Message, e.Node, e.Op, e.Reason = s.Error.Message, s.Error.Node, s.Error.Op, s.Error.Kind
				if t := j.graph.byID[e.Node]; t != nil {
					e.Loc = t.loc
				}
			}
			return e
		case "cancelled":
			return &Error{Kind: KindCancelled, Job: j.ID, Message: fmt.Sprintf("job %s was cancelled", j.ID)}
		}
	}
}

// abandon cancels the job on the cluster because ctx ended, with a context of its own.
func (j *Job) abandon(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cerr := j.Cancel(cctx)
	msg := fmt.Sprintf("job %s: %v; cancelled on the cluster", j.ID, ctx.Err())
	if cerr != nil {
		msg = fmt.Sprintf("job %s: %v; cancelling it on the cluster failed: %v", j.ID, ctx.Err(), cerr)
	}
	return &Error{Kind: KindCancelled, Job: j.ID, Message: msg, Err: ctx.Err()}
}

// Cancel cancels the job and releases its results (DELETE /v1/jobs/{id}); a done job's
// fetched tensors are gone after it.
func (j *Job) Cancel(ctx context.Context) error {
	_, err := j.c.do(ctx, http.MethodDelete, "/v1/jobs/"+url.PathEscape(j.ID), nil, nil)
	return err
}

// Fetch reads a fetched tensor of a done job (GET /v1/jobs/{id}/tensors/{name}).
func (j *Job) Fetch(ctx context.Context, t *Tensor) (*Array, error) {
	name := j.Name(t)
	if name == "" {
		return nil, newError(KindRequest, "the tensor was not fetched by this job")
	}
	return j.FetchName(ctx, name)
}

// FetchGrad reads the gradient with respect to w of a done job.
func (j *Job) FetchGrad(ctx context.Context, w *Tensor) (*Array, error) {
	name := j.GradName(w)
	if name == "" {
		return nil, newError(KindRequest, "the job asked for no gradient with respect to this tensor")
	}
	return j.FetchName(ctx, name)
}

// FetchName reads a fetched name ("loss", "grad:w1") of a done job.
func (j *Job) FetchName(ctx context.Context, name string) (*Array, error) {
	r, err := j.c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(j.ID)+"/tensors/"+url.PathEscape(name), nil, nil)
	if err != nil {
		return nil, err
	}
	shape := []int{}
	if h := strings.TrimSpace(r.header.Get("X-Triplane-Shape")); h != "" {
		for _, p := range strings.Split(h, ",") {
			d, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil {
				return nil, newError(KindInternal, "bad X-Triplane-Shape header "+h)
			}
			shape = append(shape, d)
		}
	}
	a := &Array{Shape: shape, DType: DType(r.header.Get("X-Triplane-Dtype")), Data: r.body}
	if !a.DType.Valid() || prod(shape)*a.DType.Size() != len(r.body) {
		return nil, newError(KindInternal, fmt.Sprintf("fetched %d bytes for %s %v", len(r.body), a.DType, shape))
	}
	return a, nil
}

// Ref is an input tensor that reads t's value as this job computed it ("<job>:<name>"),
// without a copy through the client: the next training step's parameters.
func (j *Job) Ref(t *Tensor) *Tensor {
	name := j.Name(t)
	if name == "" {
		return &Tensor{op: "input", loc: callerLoc(), err: newError(KindRequest, "Ref: the tensor was not fetched by this job")}
	}
	return Input(j.ID+":"+name, t.typ.Shape, WithDtype(t.typ.DType))
}

// GradRef is an input tensor reading the gradient with respect to w that this job
// computed ("<job>:grad:<w>"), typed as w.
func (j *Job) GradRef(w *Tensor) *Tensor {
	name := j.GradName(w)
	if name == "" {
		return &Tensor{op: "input", loc: callerLoc(), err: newError(KindRequest, "GradRef: the job asked for no gradient with respect to this tensor")}
	}
	return Input(j.ID+":"+name, w.typ.Shape, WithDtype(w.typ.DType))
}

// Run submits, waits and fetches every tensor of fetch; the job is returned too (its
// results stay on the cluster until Cancel, so later jobs may read them by Ref).
func (c *Client) Run(ctx context.Context, fetch []*Tensor, opts ...SubmitOption) ([]*Array, *Job, error) {
	j, err := c.Submit(ctx, fetch, opts...)
	if err != nil {
		return nil, nil, err
	}
	if err := j.Wait(ctx); err != nil {
		return nil, j, err
	}
	out := make([]*Array, len(fetch))
	for i, t := range fetch {
		if out[i], err = j.Fetch(ctx, t); err != nil {
			return nil, j, err
		}
	}
	return out, j, nil
}

func asError(err error, target **Error) bool {
	e, ok := err.(*Error)
	if ok {
		*target = e
	}
	return ok
}
