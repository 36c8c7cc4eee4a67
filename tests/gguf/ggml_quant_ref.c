// A tiny driver over llama.cpp's reference quantizers, the independent reference for RLX's
// quantize of the K-quants, Q8_1 and Q8_K (tests/gguf/test_quants.cpp). It links only
// ggml-quants.c from llama.cpp (scripts/build_llama_cpp.sh builds it) plus the few ggml
// symbols below, so no ggml library is built.
//
//   ggml_quant_ref quantize   TYPE IN.f32 OUT.bin   quantize_row_<type>_ref over the whole file
//   ggml_quant_ref dequantize TYPE IN.bin OUT.f32   dequantize_row_<type>
//
// TYPE is ggml's name (Q4_0 ... Q8_K). The input is one row; its length must be a multiple
// of the type's block. Exit status 2 on a usage error.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

// ggml.c symbols that ggml-quants.c references (outside the functions this driver calls).
void ggml_abort(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ggml_abort at %s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) {
  (void)type;
  (void)ne;
  ggml_abort(__FILE__, __LINE__, "ggml_row_size is not available in this driver");
  return 0;
}
size_t ggml_type_size(enum ggml_type type) {
  (void)type;
  ggml_abort(__FILE__, __LINE__, "ggml_type_size is not available in this driver");
  return 0;
}
const char* ggml_type_name(enum ggml_type type) {
  (void)type;
  return "?";
}
void ggml_log_internal(enum ggml_log_level level, const char* format, ...) {
  (void)level;
  va_list ap;
  va_start(ap, format);
  vfprintf(stderr, format, ap);
  va_end(ap);
}

typedef void (*quantize_fn)(const float* x, void* y, int64_t k);
typedef void (*dequantize_fn)(const void* x, float* y, int64_t k);

struct entry {
  const char* name;
  int block_elems;
  size_t block_bytes;
  quantize_fn quantize;
  dequantize_fn dequantize;  // NULL where ggml has none (Q8_1)
};

#define Q(fn) ((quantize_fn)(fn))
#define D(fn) ((dequantize_fn)(fn))
static const struct entry kEntries[] = {
    {"Q4_0", QK4_0, sizeof(block_q4_0), Q(quantize_row_q4_0_ref), D(dequantize_row_q4_0)},
    {"Q4_1", QK4_1, sizeof(block_q4_1), Q(quantize_row_q4_1_ref), D(dequantize_row_q4_1)},
    {"Q5_0", QK5_0, sizeof(block_q5_0), Q(quantize_row_q5_0_ref), D(dequantize_row_q5_0)},
    {"Q5_1", QK5_1, sizeof(block_q5_1), Q(quantize_row_q5_1_ref), D(dequantize_row_q5_1)},
    {"Q8_0", QK8_0, sizeof(block_q8_0), Q(quantize_row_q8_0_ref), D(dequantize_row_q8_0)},
    {"Q8_1", QK8_1, sizeof(block_q8_1), Q(quantize_row_q8_1_ref), NULL},
    {"Q2_K", QK_K, sizeof(block_q2_K), Q(quantize_row_q2_K_ref), D(dequantize_row_q2_K)},
    {"Q3_K", QK_K, sizeof(block_q3_K), Q(quantize_row_q3_K_ref), D(dequantize_row_q3_K)},
    {"Q4_K", QK_K, sizeof(block_q4_K), Q(quantize_row_q4_K_ref), D(dequantize_row_q4_K)},
    {"Q5_K", QK_K, sizeof(block_q5_K), Q(quantize_row_q5_K_ref), D(dequantize_row_q5_K)},
    {"Q6_K", QK_K, sizeof(block_q6_K), Q(quantize_row_q6_K_ref), D(dequantize_row_q6_K)},
    {"Q8_K", QK_K, sizeof(block_q8_K), Q(quantize_row_q8_K_ref), D(dequantize_row_q8_K)},
};

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

static void write_file(const char* path, const void* data, size_t size) {
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s quantize|dequantize TYPE IN OUT\n", argv[0]);
    return 2;
  }
  const struct entry* e = NULL;
  for (size_t i = 0; i < sizeof(kEntries) / sizeof(kEntries[0]); ++i)
    if (strcmp(kEntries[i].name, argv[2]) == 0) e = &kEntries[i];
  if (!e) {
    fprintf(stderr, "unknown type %s\n", argv[2]);
    return 2;
  }
  size_t in_size = 0;
  void* in = read_file(argv[3], &in_size);
  if (strcmp(argv[1], "quantize") == 0) {
    size_t n = in_size / sizeof(float);
    if (in_size % sizeof(float) != 0 || n % (size_t)e->block_elems != 0) {
      fprintf(stderr, "%s: %zu bytes is not a whole number of %d-element blocks\n", argv[3], in_size, e->block_elems);
      return 2;
    }
    size_t out_size = n / (size_t)e->block_elems * e->block_bytes;
    void* out = calloc(out_size ? out_size : 1, 1);
    e->quantize((const float*)in, out, (int64_t)n);
    write_file(argv[4], out, out_size);
    free(out);
  } else if (strcmp(argv[1], "dequantize") == 0) {
    if (!e->dequantize) {
      fprintf(stderr, "ggml has no dequantize_row for %s\n", e->name);
      return 2;
    }
    if (in_size % e->block_bytes != 0) {
      fprintf(stderr, "%s: %zu bytes is not a whole number of %zu-byte blocks\n", argv[3], in_size, e->block_bytes);
      return 2;
    }
    size_t n = in_size / e->block_bytes * (size_t)e->block_elems;
    float* out = calloc(n ? n : 1, sizeof(float));
    e->dequantize(in, out, (int64_t)n);
    write_file(argv[4], out, n * sizeof(float));
    free(out);
  } else {
    fprintf(stderr, "unknown mode %s (quantize or dequantize)\n", argv[1]);
    return 2;
  }
  free(in);
  return 0;
}
