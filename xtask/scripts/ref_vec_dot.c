// ref_vec_dot: the reference engine's own CPU dot kernels on given inputs, for
// `cargo xtask golden dot`.
//
// Reads records from stdin until EOF: i32 ggml type id, i32 row length n, the weight
// row (ggml_row_size(type, n) bytes), then n f32 activations. For each record it
// quantizes the activations with the CPU backend's `from_float` of the weight's
// `vec_dot_type` and takes one `vec_dot` (the kernels a one-token matmul runs without
// weight repacking), then writes the quantized activation row and the f32 result.
// Errors go to stderr with a non-zero exit.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ggml.h"
#include "ggml-cpu.h"

static void read_exact(void * dst, size_t n) {
    if (fread(dst, 1, n, stdin) != n) {
        fprintf(stderr, "ref_vec_dot: short read of %zu bytes\n", n);
        exit(2);
    }
}

int main(void) {
    ggml_cpu_init();
    int32_t header[2];
    while (fread(header, sizeof(int32_t), 2, stdin) == 2) {
        const enum ggml_type type = (enum ggml_type) header[0];
        const int64_t n = header[1];
        const struct ggml_type_traits_cpu * traits = ggml_get_type_traits_cpu(type);
        if (traits == NULL || traits->vec_dot == NULL) {
            fprintf(stderr, "ref_vec_dot: type %d has no vec_dot\n", (int) type);
            return 2;
        }
        const enum ggml_type act_type = traits->vec_dot_type;
        const struct ggml_type_traits_cpu * act = ggml_get_type_traits_cpu(act_type);
        const size_t w_size = ggml_row_size(type, n);
        const size_t x_size = ggml_row_size(act_type, n);
        void * w = malloc(w_size);
        float * x = malloc(sizeof(float) * (size_t) n);
        void * xq = malloc(x_size);
        if (w == NULL || x == NULL || xq == NULL) {
            fprintf(stderr, "ref_vec_dot: out of memory\n");
            return 2;
        }
        read_exact(w, w_size);
        read_exact(x, sizeof(float) * (size_t) n);
        if (act_type == GGML_TYPE_F32) {
            for (int64_t i = 0; i < n; i++) {
                ((float *) xq)[i] = x[i];
            }
        } else {
            act->from_float(x, xq, n);
        }
        float result = 0.0f;
        traits->vec_dot((int) n, &result, 0, w, 0, xq, 0, 1);
        fwrite(xq, 1, x_size, stdout);
        fwrite(&result, sizeof(float), 1, stdout);
        free(w);
        free(x);
        free(xq);
    }
    return 0;
}
