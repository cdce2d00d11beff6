package triplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// An unreachable scheduler fails within the bounded retry, with kind connection.
func TestUnreachableSchedulerFailsWithinTheRetryBound(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connections are refused
	c, err := NewClient("http://"+addr, "tok")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Nodes(context.Background())
	took := time.Since(start)
	if !errors.Is(err, ErrConnection) {
		t.Fatalf("got %v, want a connection error", err)
	}
	// 4 retries waiting 0.1 + 0.2 + 0.4 + 0.8 s: 1.5 s, and not a hang
	if took < 1400*time.Millisecond || took > 10*time.Second {
		t.Errorf("gave up after %v; the bound is about 1.5 s", took)
	}
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Errorf("the network error is not wrapped: %v", err)
	}
	t.Logf("unreachable after %v: %v", took.Round(time.Millisecond), err)
}

// flaky fails the first n round trips with err, then passes them to the default transport.
type flaky struct {
	n     int32
	err   error
	tries atomic.Int32
}

func (f *flaky) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.tries.Add(1) <= f.n {
		return nil, f.err
	}
	return http.DefaultTransport.RoundTrip(r)
}

func testServer(t *testing.T, status int, body string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestRetriesOnConnectionErrorsOnly(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	ok := testServer(t, 200, `[]`)
	for _, tc := range []struct {
		name   string
		method string
		fails  int32
		err    error
		tries  int32
		wantOK bool
	}{
		{"refused GET, then up", http.MethodGet, 2, refused, 3, true},
		{"refused POST, then up (nothing was sent)", http.MethodPost, 2, refused, 3, true},
		{"reset GET is retried", http.MethodGet, 1, reset, 2, true},
		{"reset POST is not (it may have been received)", http.MethodPost, 1, reset, 1, false},
		{"refused more often than the bound", http.MethodGet, 10, refused, 3, false},
	} {
		f := &flaky{n: tc.fails, err: tc.err}
		c, _ := NewClient(ok.URL, "tok", WithHTTPClient(&http.Client{Transport: f}), WithRetries(2, time.Millisecond))
		_, err := c.do(context.Background(), tc.method, "/v1/nodes", nil, nil)
		if (err == nil) != tc.wantOK || f.tries.Load() != tc.tries {
			t.Errorf("%s: err %v after %d tries, want ok=%v after %d", tc.name, err, f.tries.Load(), tc.wantOK, tc.tries)
		}
		if err != nil && !errors.Is(err, ErrConnection) {
			t.Errorf("%s: kind %v", tc.name, err)
		}
	}
	// an HTTP answer is never retried, even a 503
	var hits atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(503)
		fmt.Fprint(w, `{"error": {"kind": "unavailable", "message": "no executor", "node": null, "op": null}}`)
	}))
	defer s.Close()
	c, _ := NewClient(s.URL, "tok", WithRetries(3, time.Millisecond))
	_, err := c.Nodes(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindUnavailable || e.Message != "no executor" || e.Status != 503 || hits.Load() != 1 {
		t.Errorf("503: %#v after %d requests", err, hits.Load())
	}
}

func TestServerErrorsKeepKindMessageAndNode(t *testing.T) {
	s := testServer(t, 400, `{"error": {"kind": "shape", "message": "node 'y' (matmul): inner dimensions differ", "node": "y", "op": "matmul"}}`)
	c, _ := NewClient(s.URL, "tok")
	_, err := c.Nodes(context.Background())
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrShape) || e.Node != "y" || e.Op != "matmul" || e.Status != 400 {
		t.Fatalf("%#v", err)
	}
	s403 := testServer(t, 403, `{"error": {"kind": "forbidden", "message": "a read token may not submit"}}`)
	c, _ = NewClient(s403.URL, "tok")
	if _, err := c.Nodes(context.Background()); !errors.Is(err, ErrForbidden) {
		t.Errorf("403: %v", err)
	}
}

func TestTargetFromArgumentsEnvironmentOrRunDirectory(t *testing.T) {
	home := t.TempDir()
	t.Setenv("TRIPLANE_HOME", home)
	t.Setenv("TRIPLANE_URL", "")
	t.Setenv("TRIPLANE_TOKEN", "")
	if _, err := NewClient("", ""); !errors.Is(err, ErrConfig) {
		t.Fatalf("no cluster anywhere: %v", err)
	}
	os.WriteFile(filepath.Join(home, "cluster.json"), []byte(`{"url": "http://127.0.0.1:7001", "pids": {}}`), 0o600)
	os.WriteFile(filepath.Join(home, "token"), []byte("run-dir-token\n"), 0o600)
	c, err := NewClient("", "")
	if err != nil || c.URL() != "http://127.0.0.1:7001" || c.token != "run-dir-token" {
		t.Fatalf("run directory: %v %+v", err, c)
	}
	// the run directory's token goes with its own URL only
	c, _ = NewClient("http://127.0.0.1:7001/", "")
	if c.token != "run-dir-token" {
		t.Errorf("same URL: token %q", c.token)
	}
	c, _ = NewClient("http://127.0.0.1:9999", "")
	if c.token != "" {
		t.Errorf("another URL got the run directory's token")
	}
	t.Setenv("TRIPLANE_URL", "http://127.0.0.1:7002")
	t.Setenv("TRIPLANE_TOKEN", "env-token")
	c, _ = NewClient("", "")
	if c.URL() != "http://127.0.0.1:7002" || c.token != "env-token" {
		t.Errorf("environment: %+v", c)
	}
	c, _ = NewClient("http://127.0.0.1:7003", "arg-token")
	if c.URL() != "http://127.0.0.1:7003" || c.token != "arg-token" {
		t.Errorf("arguments: %+v", c)
	}
	os.WriteFile(filepath.Join(home, "cluster.json"), []byte(`not json`), 0o600)
	t.Setenv("TRIPLANE_URL", "")
	if _, err := NewClient("", ""); !errors.Is(err, ErrConfig) {
		t.Errorf("a malformed cluster.json is no cluster: %v", err)
	}
}

func TestArraysRoundTripLittleEndian(t *testing.T) {
	a, err := NewArray([]float32{1, -2.5}, 2)
	if err != nil || a.DType != Float32 || fmt.Sprint(a.Data) != "[0 0 128 63 0 0 32 192]" {
		t.Fatalf("%v %+v", err, a)
	}
	if v, _ := a.Float32(); v[1] != -2.5 {
		t.Errorf("%v", v)
	}
	i, _ := NewArray([]int64{-1, 2, 3, 4, 5, 6}, 2, 3)
	if v, _ := i.Int64(); v[0] != -1 || len(i.Data) != 48 {
		t.Errorf("%v", v)
	}
	if _, err := i.Float32(); !errors.Is(err, ErrDType) {
		t.Errorf("reading int64 as float32: %v", err)
	}
	if _, err := NewArray([]float64{1, 2, 3}, 2, 2); !errors.Is(err, ErrShape) {
		t.Errorf("3 values in 2x2: %v", err)
	}
	b, _ := NewArray([]bool{true, false})
	if f, _ := b.AsFloat64(); f[0] != 1 || f[1] != 0 {
		t.Errorf("%v", f)
	}
	h := &Array{Shape: []int{2}, DType: Float16, Data: []byte{0x00, 0x3c, 0x00, 0xc0}}
	if f, _ := h.AsFloat64(); f[0] != 1 || f[1] != -2 {
		t.Errorf("float16: %v", f)
	}
}

func TestAdamFromOpsTypesAndLocs(t *testing.T) {
	w := Input("u-w", []int{3, 2})
	g := Input("u-g", []int{3, 2})
	w2, m2, v2 := Adam(w, g, nil, nil, 1, AdamConfig{LR: 0.01})
	for _, x := range []*Tensor{w2, m2, v2, SGD(w, g, 0.1)} {
		if x.Err() != nil || fmt.Sprint(x.Shape()) != "[3 2]" || x.DType() != Float32 {
			t.Errorf("%v", x)
		}
	}
	if loc := w2.Loc(); len(loc) < 15 || loc[:15] != "client_test.go:" {
		t.Errorf("a node made inside Adam is located at the caller: %q", loc)
	}
	if err := Linear(w, Input("u-b", []int{4, 4}), nil).Err(); !errors.Is(err, ErrShape) {
		t.Errorf("linear of (3, 2) and (4, 4): %v", err)
	}
}
