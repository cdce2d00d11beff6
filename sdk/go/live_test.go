package triplane

import (
	"context"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// liveClient is a client of the cluster at TRIPLANE_TEST_URL (token TRIPLANE_TEST_TOKEN);
// the test is skipped when it is unset (tests/integration/sdk/test_go_sdk.py sets it
// after starting a local cluster).
func liveClient(t *testing.T) *Client {
	t.Helper()
	u := os.Getenv("TRIPLANE_TEST_URL")
	if u == "" {
		t.Skip("TRIPLANE_TEST_URL is unset: no live cluster to test against (tests/integration/sdk/test_go_sdk.py starts one)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Connect(ctx, u, os.Getenv("TRIPLANE_TEST_TOKEN"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return c
}

func upload[T Element](t *testing.T, c *Client, data []T, shape ...int) *Tensor {
	t.Helper()
	a, err := NewArray(data, shape...)
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.Upload(context.Background(), a)
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	return x
}

func TestLiveMatmulAndServerGradient(t *testing.T) {
	c := liveClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x := upload(t, c, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	w := upload(t, c, []float32{1, 0, 0, 1, 1, 1}, 3, 2)
	y := Matmul(x, w)
	loss := Sum(Mul(y, y))
	res, job, err := c.Run(ctx, []*Tensor{y, loss}, WithGrad(loss, w))
	if err != nil {
		t.Fatal(err)
	}
	defer job.Cancel(context.Background())
	got, _ := res[0].Float32()
	want := []float32{4, 5, 10, 11} // [[1+3, 2+3], [4+6, 5+6]]
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("y = %v, want %v", got, want)
		}
	}
	if l, _ := res[1].Float32(); l[0] != 16+25+100+121 {
		t.Errorf("loss %v", l)
	}
	// d loss / d w = x^T @ (2 y)
	g, err := job.FetchGrad(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	gv, _ := g.Float32()
	xs := [][]float32{{1, 2, 3}, {4, 5, 6}}
	ys := [][]float32{{4, 5}, {10, 11}}
	for i := 0; i < 3; i++ {
		for j := 0; j < 2; j++ {
			want := 2 * (xs[0][i]*ys[0][j] + xs[1][i]*ys[1][j])
			if math.Abs(float64(gv[i*2+j]-want)) > 1e-4 {
				t.Errorf("grad[%d,%d] = %v, want %v", i, j, gv[i*2+j], want)
			}
		}
	}
	// an SGD step reading the gradient by ref, run on the cluster
	res2, job2, err := c.Run(ctx, []*Tensor{SGD(w, job.GradRef(w), 0.01)})
	if err != nil {
		t.Fatal(err)
	}
	defer job2.Cancel(context.Background())
	w2, _ := res2[0].Float32()
	if math.Abs(float64(w2[0]-(1-0.01*gv[0]))) > 1e-5 {
		t.Errorf("sgd step %v from grad %v", w2, gv)
	}
}

func TestLiveRefusedToken(t *testing.T) {
	c := liveClient(t)
	_, err := Connect(context.Background(), c.URL(), "not-the-token")
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrUnauthorized) || e.Status != 401 {
		t.Fatalf("got %v, want the server's 401", err)
	}
	if e.Message == "" || !strings.Contains(err.Error(), e.Message) {
		t.Errorf("the server's message is missing: %q", err)
	}
	t.Logf("refused token: %v", err)
}

func TestLiveJobFailingOnTheClusterNamesTheNode(t *testing.T) {
	c := liveClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	logits := upload(t, c, []float32{0, 1, 2, 3, 4, 5}, 2, 3)
	labels := upload(t, c, []int64{0, 7}, 2) // 7 is no class of 3: the kernel refuses it
	loss := CrossEntropy(logits, labels)
	_, job, err := c.Run(ctx, []*Tensor{loss})
	if job != nil {
		defer job.Cancel(context.Background())
	}
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrJobFailed) {
		t.Fatalf("got %v, want a job failure", err)
	}
	if e.Node != job.Graph().ID(loss) || e.Message == "" || e.Job != job.ID || !strings.HasPrefix(e.Loc, "live_test.go:") {
		t.Errorf("failure %#v: want node %q, the server's message and the loc", e, job.Graph().ID(loss))
	}
	t.Logf("failed job: %v (reason %s, at %s)", err, e.Reason, e.Loc)
}

func TestLiveServerShapeErrorNamesNodeAndLoc(t *testing.T) {
	c := liveClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x := upload(t, c, []float32{1, 2, 3, 4}, 4)
	id, _ := x.attrs["tensor"].(string)
	wrong := Input(id, []int{2, 2}) // declared 2x2: the upload is (4,)
	_, err := c.Submit(ctx, []*Tensor{Relu(wrong)})
	var e *Error
	if !errors.As(err, &e) || e.Status != 400 {
		t.Fatalf("got %v, want a 400", err)
	}
	if !strings.HasPrefix(e.Loc, "live_test.go:") {
		t.Errorf("no loc on %#v", e)
	}
	t.Logf("server error: %v (node %q, loc %s)", err, e.Node, e.Loc)
}

func TestLiveCancelledContextCancelsTheJob(t *testing.T) {
	c := liveClient(t)
	// 120 dependent matmuls: seconds on a loaded 2-core machine, and 120 sequential tasks
	// (each one dispatch round trip) anywhere, so the job still runs when the context ends
	x := Tanh(Uniform([]int{768, 768}, 7, WithLow(-0.05), WithHigh(0.05)))
	for i := 0; i < 120; i++ {
		x = Tanh(Matmul(x, x))
	}
	job, err := c.Submit(context.Background(), []*Tensor{Sum(x)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = job.Wait(ctx)
	if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want a cancelled error wrapping the context's", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := job.Status(context.Background())
		if err == nil && s.State == "cancelled" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job is %+v (%v) on the cluster, not cancelled", s, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
