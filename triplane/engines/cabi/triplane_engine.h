/* triplane op-engine C ABI, version 2 (version 1: the same without tp_engine_claim).
 *
 * A shared library exporting these functions is an op engine: the generic engine
 * triplane.engines.cabi.CAbiEngine loads it with ctypes. No Python is needed on the
 * vendor's side. Every buffer is C-contiguous and owned by the caller; the library must
 * not keep a pointer after a call returns. Calls may come from several threads at once
 * (one engine handle is shared): run must be thread-safe.
 */
#ifndef TRIPLANE_ENGINE_H
#define TRIPLANE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRIPLANE_ENGINE_ABI_VERSION 2u

/* Status codes. TP_ERR_INVALID is the data's fault (a user error, not retried); the
 * others are the engine's (the scheduler may run the task elsewhere). */
enum {
    TP_OK = 0,
    TP_ERR_UNSUPPORTED = 1, /* op or dtype not implemented */
    TP_ERR_INVALID = 2,     /* bad shapes, attributes or values */
    TP_ERR_NOMEM = 3,
    TP_ERR_INTERNAL = 4
};

/* One tensor: data, its shape (ndim entries), dtype name ("float32", "float64",
 * "int32", "int64", "bool", ...) and size in bytes (product of shape x itemsize). */
typedef struct tp_buffer {
    void *data;
    const int64_t *shape;
    int32_t ndim;
    const char *dtype;
    int64_t nbytes;
} tp_buffer;

typedef struct tp_engine tp_engine; /* opaque, the library's own */

/* The ABI version the library was built against: TRIPLANE_ENGINE_ABI_VERSION. A loader
 * refuses a library whose version it does not implement. */
uint32_t tp_abi_version(void);

/* Make an engine. options_json: a JSON object (may be "{}"). On failure returns a code
 * and writes a NUL-terminated message of at most err_len bytes to err. */
int tp_engine_create(const char *options_json, tp_engine **out, char *err, size_t err_len);

void tp_engine_destroy(tp_engine *engine);

/* What the engine runs, as a NUL-terminated JSON object owned by the engine and valid
 * until destroy: {"name": str, "device": str,
 *                 "ops": {"<op>": ["<dtype>", ...], ...}}
 * An op runs on the engine when every input dtype is listed for it. */
const char *tp_engine_capabilities(tp_engine *engine);

/* Run one kernel: out (preallocated, of the op's inferred shape and dtype) =
 * op(inputs) with attrs_json (the node's attributes as a JSON object). Elementwise ops
 * receive inputs already broadcast to out's shape. Writes nothing beyond out->nbytes. */
int tp_engine_run(tp_engine *engine, const char *op, const char *attrs_json,
                  int32_t n_inputs, const tp_buffer *inputs, tp_buffer *out,
                  char *err, size_t err_len);

/* Optional (version 2; a loader finds it by name): claim a fused chain, in the manner of
 * ONNX Runtime's GetCapability. chain_json: {"ops": ["mul", "add", ...], "dtype": "float32"},
 * a chain in which each op after the first reads the previous op's output as its first
 * input, every input of that dtype. Returns how many of the leading ops the engine runs
 * as one kernel (0 or 1: it fuses none). A claimed chain of k ops then comes to
 * tp_engine_run as op "chain:mul+add" (the ops joined by '+'), attrs_json
 * {"attrs": [<each op's attributes>]}, and the inputs: the first op's, then each later
 * op's other inputs, in order. */
int32_t tp_engine_claim(tp_engine *engine, const char *chain_json);

#ifdef __cplusplus
}
#endif

#endif /* TRIPLANE_ENGINE_H */
