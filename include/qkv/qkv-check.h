/* qkv-check.h: the finite-difference gradient check.
 *
 * One helper for built-in ops, plugin ops and whole models: it builds a graph
 * from the inputs given, reduces the output to a scalar with fixed random
 * weights, and compares the gradients autodiff produces with central finite
 * differences of that scalar.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-graph.h"

G_BEGIN_DECLS

/**
 * QkvCheckBuildFunc:
 * @graph: the graph
 * @inputs: the inputs
 * @user_data: data given with the callback
 * @error: return location for a #GError
 *
 * Build the function under test from graph inputs (in the same order as the
 * tensors given to qkv_check_gradients()); return its output (any shape).
 *
 * Returns: as described above
 */
typedef QkvValue *(*QkvCheckBuildFunc)(QkvGraph *graph, QkvValue *const *inputs, gpointer user_data,
                                       GError **error);

/**
 * QkvCheckOptions:
 *
 * A check options.
 */
typedef struct {
  double eps;        /* finite-difference step (default 1e-2 for f32 math in double) */
  double rel_tol;    /* allowed |analytic - numeric| / max(|numeric|, abs_floor) */
  double abs_floor;  /* default 1e-2 */
  gboolean training; /* compile for training (dropout active, fixed seed) */
  guint64 seed;      /* seed of the reduction weights and dropout */
  gpointer reserved[4];
} QkvCheckOptions;

/**
 * qkv_check_options_default: (skip)
 *
 * Check options default.
 *
 * Returns: the #QkvCheckOptions
 */
QKV_API
QkvCheckOptions qkv_check_options_default(void);

/**
 * qkv_check_gradients: (skip)
 * @n_inputs: the n inputs
 * @inputs: a #QkvTensor
 * @check: (nullable): the check
 * @build: (scope call) (closure user_data): a #QkvCheckBuildFunc
 * @user_data: (closure): data for the callback
 * @options: (nullable): a #QkvCheckOptions
 * @max_rel_err: (out) (optional): where to store the max rel err, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Check d out / d inputs[i] for every f32 input whose check[i] is TRUE (check
 * may be NULL: every f32 input). The inputs are not modified. Returns FALSE
 * with a message naming the input, the element, and both values on the first
 * mismatch; *max_rel_err (may be NULL) gets the largest relative error seen.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_check_gradients(guint n_inputs, QkvTensor *const *inputs, const gboolean *check,
                             QkvCheckBuildFunc build, gpointer user_data,
                             const QkvCheckOptions *options, double *max_rel_err, GError **error);

/**
 * qkv_check_evaluate: (skip)
 * @n_inputs: the n inputs
 * @inputs: a #QkvTensor
 * @build: (scope call) (closure user_data): a #QkvCheckBuildFunc
 * @user_data: (closure): data for the callback
 * @training: the training
 * @error: return location for a #GError, or %NULL
 *
 * Evaluate the graph built by build on inputs; returns the output tensor
 * (owned by the caller), or NULL with an error.
 *
 * Returns: (transfer none) (nullable): a #QkvTensor, or %NULL with @error set
 */
QKV_API
QkvTensor *qkv_check_evaluate(guint n_inputs, QkvTensor *const *inputs, QkvCheckBuildFunc build,
                              gpointer user_data, gboolean training, GError **error);

G_END_DECLS
