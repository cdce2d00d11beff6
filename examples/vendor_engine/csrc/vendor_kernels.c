/* An example vendor op engine in C: add, mul, relu and matmul on float32, and one user
 * op, vendor_softplus (log(1 + exp(x))), behind triplane's C ABI (triplane_engine.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "triplane_engine.h"

struct tp_engine {
    int unused;
};

static const char CAPS[] =
    "{\"name\": \"vendor_c\", \"device\": \"cpu\", \"ops\": {"
    "\"add\": [\"float32\"], \"mul\": [\"float32\"], \"relu\": [\"float32\"],"
    " \"matmul\": [\"float32\"], \"vendor_softplus\": [\"float32\"]}}";

static int fail(char *err, size_t len, int code, const char *msg, const char *op) {
    if (err && len) snprintf(err, len, "%s: %s", op, msg);
    return code;
}

uint32_t tp_abi_version(void) { return TRIPLANE_ENGINE_ABI_VERSION; }

int tp_engine_create(const char *options_json, tp_engine **out, char *err, size_t err_len) {
    (void)options_json;
    *out = calloc(1, sizeof(tp_engine));
    if (!*out) return fail(err, err_len, TP_ERR_NOMEM, "no memory", "create");
    return TP_OK;
}

void tp_engine_destroy(tp_engine *engine) { free(engine); }

const char *tp_engine_capabilities(tp_engine *engine) {
    (void)engine;
    return CAPS;
}

static int is_f32(const tp_buffer *b) { return strcmp(b->dtype, "float32") == 0; }

static int64_t count(const tp_buffer *b) {
    int64_t n = 1;
    for (int32_t i = 0; i < b->ndim; i++) n *= b->shape[i];
    return n;
}

/* (..., M, K) @ (..., K, N) with broadcast batch dimensions; 1-D operands as numpy. */
static int matmul(const tp_buffer *a, const tp_buffer *b, tp_buffer *o, char *err, size_t len) {
    int32_t an = a->ndim, bn = b->ndim, on = o->ndim;
    if (an < 1 || bn < 1) return fail(err, len, TP_ERR_INVALID, "scalar operand", "matmul");
    int64_t M = an >= 2 ? a->shape[an - 2] : 1, K = a->shape[an - 1];
    int64_t Kb = bn >= 2 ? b->shape[bn - 2] : b->shape[0], N = bn >= 2 ? b->shape[bn - 1] : 1;
    if (K != Kb) return fail(err, len, TP_ERR_INVALID, "inner dimensions differ", "matmul");
    int32_t a_batch = an > 2 ? an - 2 : 0, b_batch = bn > 2 ? bn - 2 : 0;
    int32_t o_batch = on - (an >= 2) - (bn >= 2);
    if (o_batch < 0 || o_batch > 16) return fail(err, len, TP_ERR_INVALID, "bad output rank", "matmul");
    int64_t batches = 1;
    for (int32_t i = 0; i < o_batch; i++) batches *= o->shape[i];
    if ((int64_t)(batches * M * N * 4) != o->nbytes)
        return fail(err, len, TP_ERR_INVALID, "output size does not match", "matmul");
    const float *A = a->data, *B = b->data;
    float *C = o->data;
    int64_t idx[16];
    for (int64_t t = 0; t < batches; t++) {
        int64_t rest = t;
        for (int32_t i = o_batch - 1; i >= 0; i--) { idx[i] = rest % o->shape[i]; rest /= o->shape[i]; }
        int64_t ao = 0, bo = 0;
        for (int32_t i = 0; i < a_batch; i++) {
            int64_t d = a->shape[i], j = idx[o_batch - a_batch + i];
            ao = ao * d + (d == 1 ? 0 : j);
        }
        for (int32_t i = 0; i < b_batch; i++) {
            int64_t d = b->shape[i], j = idx[o_batch - b_batch + i];
            bo = bo * d + (d == 1 ? 0 : j);
        }
        const float *x = A + ao * M * K, *y = B + bo * K * N;
        float *z = C + t * M * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++) s += x[m * K + k] * y[k * N + n];
                z[m * N + n] = s;
            }
    }
    return TP_OK;
}

int tp_engine_run(tp_engine *engine, const char *op, const char *attrs_json, int32_t n_inputs,
                  const tp_buffer *in, tp_buffer *out, char *err, size_t err_len) {
    (void)engine;
    (void)attrs_json;
    for (int32_t i = 0; i < n_inputs; i++)
        if (!is_f32(&in[i])) return fail(err, err_len, TP_ERR_UNSUPPORTED, "only float32", op);
    if (!is_f32(out)) return fail(err, err_len, TP_ERR_UNSUPPORTED, "only float32 results", op);
    if (strcmp(op, "matmul") == 0) {
        if (n_inputs != 2) return fail(err, err_len, TP_ERR_INVALID, "needs 2 inputs", op);
        return matmul(&in[0], &in[1], out, err, err_len);
    }
    /* elementwise: inputs arrive broadcast to the output's shape */
    int64_t n = count(out);
    if (out->nbytes != n * 4) return fail(err, err_len, TP_ERR_INVALID, "output size does not match", op);
    for (int32_t i = 0; i < n_inputs; i++)
        if (count(&in[i]) != n) return fail(err, err_len, TP_ERR_INVALID, "input not broadcast", op);
    float *z = out->data;
    if ((strcmp(op, "add") == 0 || strcmp(op, "mul") == 0) && n_inputs == 2) {
        const float *x = in[0].data, *y = in[1].data;
        if (op[0] == 'a')
            for (int64_t i = 0; i < n; i++) z[i] = x[i] + y[i];
        else
            for (int64_t i = 0; i < n; i++) z[i] = x[i] * y[i];
        return TP_OK;
    }
    if (n_inputs != 1) return fail(err, err_len, TP_ERR_INVALID, "needs 1 input", op);
    const float *x = in[0].data;
    if (strcmp(op, "relu") == 0) {
        for (int64_t i = 0; i < n; i++) z[i] = x[i] > 0.0f ? x[i] : 0.0f;
        return TP_OK;
    }
    if (strcmp(op, "vendor_softplus") == 0) {
        for (int64_t i = 0; i < n; i++) z[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
        return TP_OK;
    }
    return fail(err, err_len, TP_ERR_UNSUPPORTED, "no such op in vendor_c", op);
}
