/* bf16-peak.h: the bf16 figures of qkv-sgemm-peak (bf16-peak.c). */
#pragma once

#include <glib.h>

/* GFLOP/s of n threads running a register-only loop of independent
 * VDPBF16PS (zmm: 16 lanes × 2 bf16 products added into float32, 64 FLOPs
 * per instruction) at once, best of three tries; 0 (and *why set) where the
 * CPU has no AVX512_BF16 or qkv-sgemm-peak was built without it. */
double bf16_dot_peak(gint n, const gchar **why);

/* GFLOP/s (2·m·n·k per call) of oneDNN's bf16 matmul (bf16 operands,
 * float32 output, row-major, no transposes; the operands converted once
 * before timing) on n OpenMP threads: the median of calls made for at least
 * seconds and at least 5 calls; *isa gets the kernel family oneDNN reports
 * (its ISA), 0 (and *isa the reason) when oneDNN is missing or refuses. */
double bf16_onednn_matmul(gint n, gint64 m, gint64 nn, gint64 k, double seconds, const gchar **isa);
