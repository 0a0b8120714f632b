/* mha-internal.h: what mha.c (the multi_head_attention op, its shape rule
 * and forward kernel) shares with mha-backward.c (its gradient rule and the
 * fused multi_head_attention_backward op); not installed, and
 * G_GNUC_INTERNAL keeps it out of the library's exported symbols. */
#pragma once

#include "flash-attention.h"

/* Output indices of the forward op. */
enum { OUT_OUT, OUT_WEIGHTS, OUT_QP, OUT_KP, OUT_VP, OUT_CONCAT, OUT_MASK };

/* ---- where the optional inputs sit -----------------------------------------
 *
 * Each slots struct says where a node's optional inputs sit (-1: absent).
 * Its function takes the same struct with each field saying whether that
 * input is present (nonzero) and lays them out in order after the required
 * inputs; the _of function finds the layout of an existing node. */

/* multi_head_attention: queries, keys, values, w_q, w_k, w_v, w_o, then
 * the biases b_q, b_k, b_v, b_o (all four or none; bias is b_q's slot),
 * valid_lens and the mask. */
#define MHA_FIRST_OPTIONAL 7
#define MHA_MAX_INPUTS 13
typedef struct {
  gint bias, valid_lens, mask;
  guint n_inputs;
} MhaSlots;

G_GNUC_INTERNAL MhaSlots mha_slots(MhaSlots present);
/* mask_kind says whether there is a mask, the count whether there are
 * biases and valid lengths (no two choices give the same count). */
G_GNUC_INTERNAL gboolean mha_slots_of(guint n_inputs, const QkvAttrs *attrs, MhaSlots *s);

/* multi_head_attention_backward: the forward's required inputs, its outputs
 * weights (with flash the row statistics), q_proj, k_proj, v_proj and
 * concat, then the dropout mask (with flash the dropout key), dout,
 * dweights, valid_lens and the mask (MhaBackwardSlots in mha-backward.c). */
enum { BW_WEIGHTS = MHA_FIRST_OPTIONAL, BW_QP, BW_KP, BW_VP, BW_CONCAT, BW_FIRST_OPTIONAL };
#define MHA_MAX_BACKWARD_INPUTS 17

/* ---- shared by the forward and backward ops ----------------------------- */

/* The sizes of one node. */
typedef struct {
  gint64 batch, n_q, n_k, d_q, d_k, d_v, hidden, heads, dh;
} MhaDims;

G_GNUC_INTERNAL MhaDims mha_dims(const QkvShape *shapes, gint64 heads);
/* Checks the forward inputs 0..6 (and the biases at bias_index.. if
 * bias_index ≥ 0) and the heads. */
G_GNUC_INTERNAL gboolean mha_check_inputs(QkvShapeCtx *ctx, gint bias_index, GError **error);
/* The attention problem of one (batch, head): operands are column blocks of
 * the (rows, H) projections. values receives the description of the mask
 * input (may be NULL: none). */
G_GNUC_INTERNAL QkvAttnProblem mha_problem_of(const MhaDims *d, const QkvView *valid_lens,
                                              const QkvView *mask, QkvAttnScoreMask *values,
                                              const QkvAttrs *attrs);
/* Threads for the (batch, head) problems. */
G_GNUC_INTERNAL gint mha_problem_threads(const QkvKernelCtx *ctx, const MhaDims *d,
                                         gsize per_thread, gsize available);
/* The flash kernels' layout of the (batch, head) problems: column blocks of
 * the projections, as the weights path reads them. */
G_GNUC_INTERNAL QkvFlashLayout mha_flash_layout_of(const QkvAttnProblem *pb, const MhaDims *d,
                                                   const QkvAttrs *attrs);

/* The (batch, head) attention problems, forward or backward. */
typedef struct {
  const QkvKernelCtx *ctx;
  const QkvAttnProblem *pb;
  const MhaDims *d;
  gconstpointer proj[3];          /* stored as pb->q_dtype, k_dtype, v_dtype */
  float *weights, *mask, *concat; /* forward outputs */
  const float *p, *drop, *dw;     /* backward inputs */
  const float *dconcat;
  float *dproj[3];
  float *scratch;        /* per-thread scratch, or NULL */
  gint64 scratch_floats; /* per thread */
  float *dscores;        /* backward: the scores' gradient (B, heads, n_q, n_k), or NULL */
} MhaProblemsJob;

/* ---- mha-backward.c ----------------------------------------------------- */

/* The forward op's gradient rule. */
G_GNUC_INTERNAL gboolean mha_grad(QkvGradCtx *g, GError **error);
/* The backward op's shape rule, kernel and scratch size. */
G_GNUC_INTERNAL gboolean mha_backward_shape(QkvShapeCtx *ctx, GError **error);
G_GNUC_INTERNAL void mha_backward_kernel(const QkvKernelCtx *ctx);
G_GNUC_INTERNAL gsize mha_backward_scratch(const QkvShapeCtx *ctx, gint n_threads);
