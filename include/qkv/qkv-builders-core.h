/* qkv-builders-core.h: what every builder takes (qkv-builders.h says what
 * builders do): QkvBuilder with its initialisers by role (QkvBuilderInits)
 * and its cached mode for generation (QkvBuilderCache), name scopes, the
 * all-or-nothing steps of qkv_builder_begin() and qkv_builder_end(), and
 * bare parameters (qkv_build_param()). */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-graph.h"
#include "qkv-init.h"

G_BEGIN_DECLS

/**
 * QkvBuilderInits:
 *
 * The initialisers a builder gives the parameters it creates, by role. A
 * role whose kind is QKV_INIT_DEFAULT (zero) keeps the book's choice, so a
 * zero-initialised QkvBuilderInits changes nothing. Parameters that already
 * exist in the store are reused as they are.
 */
typedef struct {
  /* every table initialised as nn.Embedding is (init "embedding"): the
   * embeddings, a tied output matrix, the attention pooling's queries;
   * default N(0, 1) */
  QkvInit embedding;
  /* every weight matrix initialised as nn.Linear's is (init
   * "linear_weight"): linear layers, attention projections, GRU and Luong
   * weights; default QkvBuilder.xavier_linear's rule */
  QkvInit weight;
  /* every bias initialised as nn.Linear's is (init "linear_bias"): default
   * U(±1/√fan_in) */
  QkvInit bias;
  gpointer reserved[2];
} QkvBuilderInits;

/**
 * QkvBuilderCache:
 *
 * A builder's cached mode, for generation: the graph takes a few new tokens
 * per row (usually one) and keeps the keys and values of the ones before
 * in graph states (qkv_graph_state()), so the same model function builds
 * the training graph (QkvBuilder.cache NULL) and the one-token step graph.
 * In cached mode:
 *  - every causal self-attention (qkv_build_mha_full() and friends with
 *    queries, keys and values the same value and causal set) x (B, t, ·)
 *    creates its key and value states "<scope>.<name>.k_cache" and
 *    ".v_cache" (B, heads, max_len, num_hiddens / heads), appends the t new
 *    keys and values at each row's positions[b] (kv_cache_append) and
 *    attends over each row's filled part, query i of row b seeing the slots
 *    up to positions[b] + i: rows at different positions decode together.
 *    Dropout does not apply (a cached graph is for inference); valid_lens
 *    and a mask are refused (QKV_ERROR_INVALID_ARGUMENT). Other attentions
 *    (not causal, or keys that are not the queries: cross-attention) run as
 *    without a cache, on their whole inputs every run, unless cross_inputs
 *    is set: then every cross-attention (keys that are not its queries)
 *    takes its keys and values already projected, as the graph inputs
 *    "<scope>.<name>.keys" and ".values" (B, heads, n_k, num_hiddens /
 *    heads) that the caller binds, made once per source by
 *    qkv_build_mha_keys_values() (in an encoder's plan, say), instead of
 *    projecting the same keys at every step (only their shape is read);
 *  - qkv_build_positions() gives the rows' token positions, and the
 *    Transformer decoder (qkv_build_transformer_decoder()) encodes its
 *    tokens at them.
 * A plan compiled from the graph keeps the caches between runs; the caller
 * binds positions, the position of each row's first new token, and keeps
 * positions + t ≤ max_len (the plan refuses more). Slots past a row's
 * position are never read, so a row restarts at position 0 without a
 * reset (qkv_plan_reset_state() zeroes them all); qkv_plan_reorder_states()
 * moves rows to their parents for beam search.
 */
typedef struct {
  gint64 max_len;      /* T_max: the positions each cache holds, ≥ 1 */
  QkvValue *positions; /* i32 (B): where each row's new tokens start */
  gboolean cross_inputs; /* cross-attention keys and values come projected */
  gpointer reserved[2];
} QkvBuilderCache;

/**
 * QkvBuilderScopes:
 *
 * The scope stack of a builder (private; see qkv_builder_push()).
 */
typedef struct _QkvBuilderScopes QkvBuilderScopes;

/**
 * QkvBuilder:
 *
 * Where builders put their nodes and parameters, and how they initialise new
 * parameters: each from qkv_init_seed_for_name(seed, name), so values do not
 * depend on the order of creation. Zero-initialise it (designated
 * initialisers do): every field after seed is optional.
 */
typedef struct {
  QkvGraph *graph;
  QkvParams *params;
  guint64 seed;
  /* TRUE: every linear weight starts Xavier-uniform (the book's
   * xavier_init_weights); FALSE: PyTorch's nn.Linear default. */
  gboolean xavier_linear;
  /* NULL, or the initialisers by role (borrowed: it must outlive the
   * builder calls); NULL is the book's choice for every role */
  const QkvBuilderInits *inits;
  /* private, managed by qkv_builder_push() and qkv_builder_pop(): NULL while
   * no scope is pushed. A builder with scopes pushed must not be copied. */
  QkvBuilderScopes *scopes;
  /* NULL, or the cached mode (QkvBuilderCache; borrowed: it must outlive
   * the builder calls). This field took one of the two reserved pointers:
   * the struct's size is unchanged. */
  const QkvBuilderCache *cache;
  gpointer reserved[1];
} QkvBuilder;

/* ---- Name scopes ----------------------------------------------------------
 *
 * A builder carries a stack of names. Every parameter a builder creates or
 * reuses is named "<scope>.<name>", where scope is the stack's names joined
 * by "." (no scope: the name alone), so a model written as
 *
 *   qkv_builder_push_printf(b, &error, "blocks.%d", i);
 *   x = qkv_build_mha(b, "attention", x, x, x, d, heads, NULL, TRUE, 0.0, NULL, &error);
 *   qkv_builder_pop(b);
 *
 * gets "blocks.3.attention.W_q.weight" without assembling it. The layer
 * builders push their own name while they run, and the graph's scope (the
 * prefix of node names, qkv_graph_set_scope()) follows the stack: a push
 * appends the name to the graph's scope of the moment, and the matching pop
 * sets the graph's scope back to what it was at the push. Parameter names do
 * not take the graph's scope, only the builder's.
 *
 * A step (qkv_builder_begin() … qkv_builder_end()) leaves the stack as it
 * found it, failed or not: levels it pushed and did not pop are popped at
 * qkv_builder_end(). */

/**
 * QKV_BUILDER_SCOPE_MAX:
 *
 * The longest scope (the joined names, in bytes) a push accepts.
 */
#define QKV_BUILDER_SCOPE_MAX 1024

/**
 * qkv_builder_push:
 * @b: a #QkvBuilder
 * @name: (nullable): the name
 * @error: return location for a #GError, or %NULL
 *
 * Push name (a non-NULL UTF-8 string; "" adds a level with no name) onto b's
 * scope stack. The stack is allocated on the first push and freed by the pop
 * that empties it; the builder owns it.
 *
 * A push always adds a level, even when it fails, so that each push is
 * matched by exactly one qkv_builder_pop() in straight-line code. It fails
 * (FALSE, QKV_ERROR_INVALID_ARGUMENT) when name is not valid UTF-8 or the
 * joined scope would exceed QKV_BUILDER_SCOPE_MAX bytes: the level is then
 * refused, it keeps the scope below it, and every parameter asked for while
 * it is on the stack fails with QKV_ERROR_INVALID_ARGUMENT, so nothing is
 * built under a name that is not the one asked for. With an error already
 * set (an earlier call of a chain failed) the push returns FALSE and keeps
 * that first error, as every call does then, and the level it adds is a
 * refused one, there for the matching pop.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_builder_push(QkvBuilder *b, const gchar *name, GError **error);
/**
 * qkv_builder_push_printf: (skip)
 * @b: a #QkvBuilder
 * @error: return location for a #GError, or %NULL
 * @format: the format
 * @...: the format's arguments
 *
 * qkv_builder_push() with a name made from a printf format.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_builder_push_printf(QkvBuilder *b, GError **error, const gchar *format, ...)
    G_GNUC_PRINTF(3, 4);
/**
 * qkv_builder_pop:
 * @b: a #QkvBuilder
 *
 * Remove the innermost level pushed and set the graph's scope back to what
 * it was at its push. Popping an empty stack is a programming error: a
 * critical warning, and nothing changes.
 */
QKV_API
void qkv_builder_pop(QkvBuilder *b);
/**
 * qkv_builder_clear_scopes:
 * @b: a #QkvBuilder
 *
 * Pop every level (the graph's scope goes back to what it was at the
 * first push) and free the stack; nothing happens when none is pushed. For
 * code that abandons a builder with scopes still pushed.
 */
QKV_API
void qkv_builder_clear_scopes(QkvBuilder *b);
/**
 * qkv_builder_get_scope:
 * @b: a #QkvBuilder
 *
 * The current scope ("blocks.0.attention"), or NULL when there is none;
 * owned by the builder until the next push or pop.
 *
 * Returns: (transfer none) (nullable): the string
 */
QKV_API
const gchar *qkv_builder_get_scope(const QkvBuilder *b);
/**
 * qkv_builder_get_scope_depth:
 * @b: a #QkvBuilder
 *
 * How many levels are pushed (0 for none).
 *
 * Returns: the guint
 */
QKV_API
guint qkv_builder_get_scope_depth(const QkvBuilder *b);
/**
 * qkv_builder_scoped_name:
 * @b: a #QkvBuilder
 * @name: the name
 *
 * The name a parameter called name gets under the current scope, newly
 * allocated (free with g_free()): for looking it up with qkv_params_lookup()
 * after building.
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_builder_scoped_name(const QkvBuilder *b, const gchar *name);

/* Builders are all-or-nothing: a builder that fails returns NULL with an
 * error (QKV_ERROR_INVALID_ARGUMENT, naming the builder and the field, for a
 * bad size or config) and leaves the graph (its nodes, values and scope) and
 * the parameter store (its parameters and their names) as they were before
 * the call; its out-parameters (weights, h_n) are set to NULL. A NULL input
 * value (an earlier step failed) gives NULL and leaves the error as it is,
 * so calls can be chained. Your own builders get the same with
 * qkv_builder_begin() and qkv_builder_end(). */

/**
 * QkvBuilderMark:
 *
 * What qkv_builder_begin() saw: the graph, the store, the graph's scope and
 * the depth of the builder's scope stack.
 */
typedef struct {
  QkvGraphMark graph;
  QkvParamsMark params;
  gchar *scope; /* owned until qkv_builder_end() */
  guint scope_depth;
  gpointer reserved[1];
} QkvBuilderMark;

/**
 * qkv_builder_begin:
 * @b: a #QkvBuilder
 * @mark: a #QkvBuilderMark
 *
 * Start a step that adds everything or nothing to b's graph and store.
 */
QKV_API
void qkv_builder_begin(QkvBuilder *b, QkvBuilderMark *mark);
/**
 * qkv_builder_end:
 * @b: a #QkvBuilder
 * @mark: a #QkvBuilderMark
 * @result: (nullable): a #QkvValue
 *
 * End the step begun with mark: when result is NULL (it failed) roll the
 * graph and the store back to mark (qkv_graph_rollback(),
 * qkv_params_rollback()); in either case pop the scopes the step left pushed
 * and set the graph's scope back to what it was at qkv_builder_begin().
 * Returns result. Steps nest. A step that popped more levels than it pushed
 * is a programming error (a critical warning; those levels are not
 * restored).
 *
 * Returns: (transfer none) (nullable): a #QkvValue
 */
QKV_API
QkvValue *qkv_builder_end(QkvBuilder *b, QkvBuilderMark *mark, QkvValue *result);

/**
 * qkv_build_param:
 * @b: a #QkvBuilder
 * @name: the name
 * @shape: a #QkvShape
 * @init: the init
 * @fan_in: the fan in
 * @error: return location for a #GError, or %NULL
 *
 * A parameter "<scope>.<name>" of the given shape: reused, or created and
 * filled by init ("zeros", "ones", "linear_weight", "linear_bias",
 * "embedding", "xavier"); "linear_weight", "linear_bias" and "embedding"
 * follow b->inits where it sets their role. fan_in is the layer's input size,
 * for "linear_bias".
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_param(QkvBuilder *b, const gchar *name, const QkvShape *shape,
                          const gchar *init, gint64 fan_in, GError **error);
/**
 * qkv_build_param_init:
 * @b: a #QkvBuilder
 * @name: the name
 * @shape: a #QkvShape
 * @init: (nullable): a #QkvInit
 * @error: return location for a #GError, or %NULL
 *
 * The same with an initialiser given as data: init must not be NULL nor
 * QKV_INIT_DEFAULT (a bare parameter has no default), else
 * QKV_ERROR_INVALID_ARGUMENT; the initialiser's own errors (see QkvInit) are
 * prefixed with the parameter's name. A reused parameter keeps its values.
 *
 * Returns: (transfer full) (nullable): a new #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_param_init(QkvBuilder *b, const gchar *name, const QkvShape *shape,
                               const QkvInit *init, GError **error);

G_END_DECLS
