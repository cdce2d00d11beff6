/* A user kernel for triplane (ABI triplane_kernel_v1, see triplane/sdk/custom.py).
 *
 * hypot(x, y) = sqrt(x*x + y*y), elementwise on two float32 tensors of one shape.
 * Returns 1 if the shapes differ (inference should have caught it) and 2 if an input
 * holds a NaN: triplane turns a non-zero return into a KernelError naming the op.
 *
 * Build: cc -O2 -shared -fPIC -o libhypot.so hypot.c -lm
 */
#include <math.h>
#include <stdint.h>

int tp_hypot(int32_t n_inputs, const void *const *inputs, const int64_t *const *input_shapes,
             const int32_t *input_ndims, void *out, const int64_t *out_shape, int32_t out_ndim) {
    if (n_inputs != 2 || input_ndims[0] != out_ndim || input_ndims[1] != out_ndim) return 1;
    int64_t n = 1;
    for (int32_t d = 0; d < out_ndim; d++) {
        if (input_shapes[0][d] != out_shape[d] || input_shapes[1][d] != out_shape[d]) return 1;
        n *= out_shape[d];
    }
    const float *x = (const float *)inputs[0];
    const float *y = (const float *)inputs[1];
    float *z = (float *)out;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(y[i])) return 2;
        z[i] = sqrtf(x[i] * x[i] + y[i] * y[i]);
    }
    return 0;
}
