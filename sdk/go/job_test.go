package triplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeScheduler answers a submit with job "j1", records the bodies and methods it got,
// and holds every wait until the request's context ends.
type fakeScheduler struct {
	mu       sync.Mutex
	submits  []map[string]any
	requests []string
}

func (f *fakeScheduler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/jobs":
		var body map[string]any
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &body)
		f.mu.Lock()
		f.submits = append(f.submits, body)
		f.mu.Unlock()
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id": "j1", "state": "queued", "plan": "abc", "args": []}`)
	case strings.HasSuffix(r.URL.Path, "/wait"):
		<-r.Context().Done()
	case r.Method == http.MethodDelete:
		fmt.Fprint(w, `{"id": "j1", "state": "cancelled"}`)
	default:
		w.WriteHeader(404)
		fmt.Fprint(w, `{"error": {"kind": "not_found", "message": "no such route"}}`)
	}
}

func TestSubmitSendsTypesLocsAndTheGradRequest(t *testing.T) {
	f := &fakeScheduler{}
	s := httptest.NewServer(f)
	defer s.Close()
	c, _ := NewClient(s.URL, "tok")
	x := Input("u-x", []int{4, 3})
	w := Input("u-w", []int{3, 2})
	loss := Mean(Matmul(x, w))
	job, err := c.Submit(context.Background(), []*Tensor{loss}, WithGrad(loss, w), WithDeadline(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if job.ID != "j1" || job.Plan != "abc" || job.GradName(w) != "grad:"+job.Graph().ID(w) || job.Name(loss) == "" {
		t.Fatalf("%+v", job)
	}
	body := f.submits[0]
	nodes := body["graph"].(map[string]any)["nodes"].(map[string]any)
	mm := nodes[job.Graph().ID(loss)].(map[string]any)
	if mm["op"] != "mean" || mm["dtype"] != "float32" || !strings.HasPrefix(mm["loc"].(string), "job_test.go:") {
		t.Errorf("node on the wire: %v", mm)
	}
	grad := body["grad"].(map[string]any)
	if grad["of"] != job.Graph().ID(loss) || fmt.Sprint(grad["wrt"]) != "["+job.Graph().ID(w)+"]" || body["deadline_s"] != 30.0 {
		t.Errorf("body: %v", body)
	}
	if fmt.Sprint(body["fetch"]) != "["+job.Graph().ID(loss)+"]" {
		t.Errorf("fetch: %v", body["fetch"])
	}
	// a ref to the gradient is typed as w
	g := job.GradRef(w)
	if g.Err() != nil || fmt.Sprint(g.Shape()) != "[3 2]" || g.Attrs()["tensor"] != "j1:grad:"+job.Graph().ID(w) {
		t.Errorf("grad ref: %v %v", g, g.Attrs())
	}
	if job.GradRef(x).Err() == nil {
		t.Error("a ref to a gradient nobody asked for")
	}
	// a bad graph is refused before anything is sent
	if _, err := c.Submit(context.Background(), []*Tensor{Matmul(w, w)}); !errors.Is(err, ErrShape) || len(f.submits) != 1 {
		t.Errorf("bad graph: %v, %d submits", err, len(f.submits))
	}
}

func TestWaitCancelsTheJobWhenTheContextEnds(t *testing.T) {
	f := &fakeScheduler{}
	s := httptest.NewServer(f)
	defer s.Close()
	c, _ := NewClient(s.URL, "tok")
	job, err := c.Submit(context.Background(), []*Tensor{Relu(Input("u", []int{2}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	err = job.Wait(ctx)
	if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if last := f.requests[len(f.requests)-1]; last != "DELETE /v1/jobs/j1" {
		t.Errorf("requests %v: the job was not cancelled on the scheduler", f.requests)
	}
}
