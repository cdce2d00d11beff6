package triplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Client talks to a triplane scheduler's REST API (docs/runtime.md). It is safe for
// concurrent use.
type Client struct {
	url     string
	token   string
	http    *http.Client
	retries int           // extra attempts after a connection error
	backoff time.Duration // first wait; doubles up to maxWait
	maxWait time.Duration
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithHTTPClient uses hc for every request (its Timeout, if any, bounds each request).
func WithHTTPClient(hc *http.Client) ClientOption { return func(c *Client) { c.http = hc } }

// WithRetries sets how many times a request is tried again after a connection error
// (refused, reset, unreachable; never after an HTTP answer) and the first wait between
// tries (doubling each time, at most 2 s). The default is 4 retries from 100 ms: an
// unreachable scheduler fails within about 1.5 s.
func WithRetries(n int, first time.Duration) ClientOption {
	return func(c *Client) { c.retries, c.backoff = n, first }
}

// NewClient makes a Client without contacting the scheduler. The URL and token are the
// arguments, else TRIPLANE_URL / TRIPLANE_TOKEN, else the cluster `triplane up` recorded
// in its run directory ($TRIPLANE_HOME, default ~/.triplane: cluster.json and token),
// as tp.connect finds them.
func NewClient(rawURL, token string, opts ...ClientOption) (*Client, error) {
	u, tok, err := resolveTarget(rawURL, token)
	if err != nil {
		return nil, err
	}
	c := &Client{
		url: strings.TrimRight(u, "/"), token: tok, retries: 4, backoff: 100 * time.Millisecond, maxWait: 2 * time.Second,
		http: &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 8,
			IdleConnTimeout:     30 * time.Second,
		}},
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Connect is NewClient, then a check that the scheduler answers and takes the token (GET
// /v1/nodes), so that a wrong URL or token fails here with the server's message.
func Connect(ctx context.Context, rawURL, token string, opts ...ClientOption) (*Client, error) {
	c, err := NewClient(rawURL, token, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := c.Nodes(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// URL is the scheduler's base URL.
func (c *Client) URL() string { return c.url }

func homeDir() string {
	if h := os.Getenv("TRIPLANE_HOME"); h != "" {
		return h
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return ".triplane"
	}
	return filepath.Join(h, ".triplane")
}

// recorded is the URL and token of the cluster in the run directory ("" when none).
func recorded(home string) (string, string) {
	raw, err := os.ReadFile(filepath.Join(home, "cluster.json"))
	if err != nil {
		return "", ""
	}
	var info struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(raw, &info) != nil || info.URL == "" {
		return "", "" // a malformed record is no cluster
	}
	tok, _ := os.ReadFile(filepath.Join(home, "token"))
	return info.URL, strings.TrimSpace(string(tok))
}

func resolveTarget(u, token string) (string, string, error) {
	if u == "" {
		u = os.Getenv("TRIPLANE_URL")
	}
	if token == "" {
		token = os.Getenv("TRIPLANE_TOKEN")
	}
	home := homeDir()
	if u == "" {
		ru, rt := recorded(home)
		if ru == "" {
			return "", "", newError(KindConfig, fmt.Sprintf("no cluster to connect to: pass a URL to triplane.Connect, set TRIPLANE_URL, or start one with `triplane up` (nothing found in %s)", home))
		}
		u = ru
		if token == "" {
			token = rt
		}
	} else if token == "" {
		if ru, rt := recorded(home); ru != "" && strings.TrimRight(ru, "/") == strings.TrimRight(u, "/") {
			token = rt
		}
	}
	if _, err := url.ParseRequestURI(u); err != nil {
		return "", "", newError(KindConfig, fmt.Sprintf("bad scheduler URL %q: %v", u, err))
	}
	return u, token, nil
}

// isConnErr: the request never got an HTTP answer because of the network (refused,
// reset, unreachable, closed early). refusedOnly: the connection was never made, so
// nothing was sent (safe to retry any method).
func isConnErr(err error) (conn, neverSent bool) {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true, true
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true, true
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.As(err, &op) {
		return true, false
	}
	return false, false
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request, retried with bounded backoff on connection errors only (any
// method when the connection was never made; GET and DELETE also when it broke).
func (c *Client) do(ctx context.Context, method, path string, body []byte, header map[string]string) (*response, error) {
	wait := c.backoff
	var last error
	for attempt := 0; attempt <= c.retries; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, &Error{Kind: KindCancelled, Message: ctx.Err().Error(), Err: ctx.Err()}
			case <-t.C:
			}
			if wait *= 2; wait > c.maxWait {
				wait = c.maxWait
			}
		}
		req, err := http.NewRequestWithContext(ctx, method, c.url+path, bytes.NewReader(body))
		if err != nil {
			return nil, &Error{Kind: KindRequest, Message: err.Error(), Err: err}
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, &Error{Kind: KindCancelled, Message: ctx.Err().Error(), Err: ctx.Err()}
			}
			conn, neverSent := isConnErr(err)
			if !conn || (!neverSent && method != http.MethodGet && method != http.MethodDelete) {
				return nil, &Error{Kind: KindConnection, Message: fmt.Sprintf("%s %s: %v", method, c.url+path, err), Err: err}
			}
			last = err
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, &Error{Kind: KindConnection, Message: fmt.Sprintf("%s %s: reading the answer: %v", method, c.url+path, err), Err: err}
		}
		r := &response{status: resp.StatusCode, header: resp.Header, body: data}
		if resp.StatusCode >= 400 {
			return nil, serverError(r)
		}
		return r, nil
	}
	return nil, &Error{Kind: KindConnection, Err: last,
		Message: fmt.Sprintf("cannot reach the scheduler at %s (%d attempts): %v", c.url, c.retries+1, last)}
}

// serverError is the API's error body {"error": {"kind", "message", "node", "op"}} as an *Error.
func serverError(r *response) *Error {
	var body struct {
		Error struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
			Node    string `json:"node"`
			Op      string `json:"op"`
		} `json:"error"`
	}
	e := &Error{Status: r.status}
	if json.Unmarshal(r.body, &body) == nil && body.Error.Kind != "" {
		e.Kind, e.Message, e.Node, e.Op = body.Error.Kind, body.Error.Message, body.Error.Node, body.Error.Op
		return e
	}
	e.Kind, e.Message = KindInternal, fmt.Sprintf("HTTP %d: %s", r.status, strings.TrimSpace(string(r.body)))
	switch r.status {
	case 401:
		e.Kind = KindUnauthorized
	case 403:
		e.Kind = KindForbidden
	case 404:
		e.Kind = KindNotFound
	case 503:
		e.Kind = KindUnavailable
	}
	return e
}

func (c *Client) getJSON(ctx context.Context, path string, out any) error {
	r, err := c.do(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	return decodeInto(r.body, out)
}

func decodeInto(b []byte, out any) error {
	if err := json.Unmarshal(b, out); err != nil {
		return &Error{Kind: KindInternal, Message: "the scheduler's answer is not the expected JSON: " + err.Error(), Err: err}
	}
	return nil
}

// Nodes is the scheduler's GET /v1/nodes (the registered executors, as JSON values).
func (c *Client) Nodes(ctx context.Context) (any, error) {
	var out any
	return out, c.getJSON(ctx, "/v1/nodes", &out)
}

// WhoAmI is the token's name and role.
func (c *Client) WhoAmI(ctx context.Context) (name, role string, err error) {
	var out struct{ Name, Role string }
	err = c.getJSON(ctx, "/v1/whoami", &out)
	return out.Name, out.Role, err
}

// Upload sends an array to the scheduler (POST /v1/tensors) and returns an input
// tensor bound to it.
func (c *Client) Upload(ctx context.Context, a *Array) (*Tensor, error) {
	if a == nil || !a.DType.Valid() {
		return nil, newError(KindDType, "upload of an array without a valid dtype")
	}
	if n := prod(a.Shape) * a.DType.Size(); n != len(a.Data) {
		return nil, newError(KindShape, fmt.Sprintf("%d bytes do not hold %s (%d bytes)", len(a.Data), TensorType{a.Shape, a.DType}, n))
	}
	dims := make([]string, len(a.Shape))
	for i, d := range a.Shape {
		dims[i] = strconv.Itoa(d)
	}
	r, err := c.do(ctx, http.MethodPost, "/v1/tensors", a.Data, map[string]string{
		"Content-Type": "application/octet-stream", "X-Triplane-Shape": strings.Join(dims, ","), "X-Triplane-Dtype": string(a.DType),
	})
	if err != nil {
		return nil, err
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := decodeInto(r.body, &out); err != nil {
		return nil, err
	}
	t := Input(out.ID, a.Shape, WithDtype(a.DType))
	return t, t.Err()
}

// Release frees an upload on the scheduler and its executors (DELETE /v1/tensors/{id}).
func (c *Client) Release(ctx context.Context, upload *Tensor) error {
	id, _ := upload.attrs["tensor"].(string)
	_, err := c.do(ctx, http.MethodDelete, "/v1/tensors/"+url.PathEscape(id), nil, nil)
	return err
}
