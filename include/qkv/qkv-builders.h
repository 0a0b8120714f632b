/* qkv-builders.h: builders that add layers and models to a graph and create
 * their parameters in a QkvParams store, under the names the book's PyTorch
 * modules give them in their state_dict (so a state_dict saved as safetensors
 * loads as is). Builders use only the public API: anything they do, a user can
 * do too.
 *
 * A parameter a builder needs is reused when the store already has it with
 * the right shape (a training graph and an evaluation graph share weights),
 * created and initialised when it is missing, and an error when its shape
 * differs. */
#pragma once

#include "qkv-api.h"

#include <glib.h>
#include "qkv-graph.h"
#include "qkv-init.h"
#include "qkv-nn.h"

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

/**
 * qkv_build_linear:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @out_features: the out features
 * @bias: the bias
 * @error: return location for a #GError, or %NULL
 *
 * nn.Linear: x (…, in) · weightᵀ (+ bias) → (…, out); "<name>.weight" (out, in),
 * "<name>.bias" (out).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_linear(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features,
                           gboolean bias, GError **error);
/**
 * qkv_build_linear_init:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @out_features: the out features
 * @bias: the bias
 * @weight_init: (nullable): a #QkvInit
 * @bias_init: (nullable): a #QkvInit
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_linear() with the initialisers of a new weight and bias chosen
 * here ("linear weights Xavier, bias zeros"); NULL or QKV_INIT_DEFAULT for
 * either keeps the builder's choice (b->inits, else the book's). A bias has
 * rank 1: Xavier or Kaiming for it fails with QKV_ERROR_SHAPE.
 *
 * Returns: (transfer full) (nullable): a new #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_linear_init(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 out_features,
                                gboolean bias, const QkvInit *weight_init, const QkvInit *bias_init,
                                GError **error);
/**
 * qkv_build_embedding:
 * @b: a #QkvBuilder
 * @name: the name
 * @ids: a #QkvValue
 * @num: the num
 * @dim: the dim
 * @error: return location for a #GError, or %NULL
 *
 * nn.Embedding: ids (…) → (…, dim); "<name>.weight" (num, dim), N(0, 1).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_embedding(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num,
                              gint64 dim, GError **error);
/**
 * qkv_build_embedding_init:
 * @b: a #QkvBuilder
 * @name: the name
 * @ids: a #QkvValue
 * @num: the num
 * @dim: the dim
 * @init: (nullable): a #QkvInit
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_embedding() with the initialiser of a new table chosen here
 * (GPT-2's N(0, 0.02²): {.kind = QKV_INIT_NORMAL, .std = 0.02}); NULL or
 * QKV_INIT_DEFAULT keeps the builder's choice.
 *
 * Returns: (transfer full) (nullable): a new #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_embedding_init(QkvBuilder *b, const gchar *name, QkvValue *ids, gint64 num,
                                   gint64 dim, const QkvInit *init, GError **error);
/**
 * qkv_build_mha:
 * @b: a #QkvBuilder
 * @name: the name
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @valid_lens: (nullable): a #QkvValue
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The book's MultiHeadAttention (bias = FALSE): "<name>.W_q.weight", W_k, W_v,
 * W_o, all (num_hiddens, ·). *weights (may be NULL) gets (B, heads, n_q, n_k);
 * with NULL, long sequences take the memory-efficient kernel
 * (qkv_multi_head_attention in qkv-nn.h).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                        QkvValue *values, gint64 num_hiddens, gint num_heads, QkvValue *valid_lens,
                        gboolean causal, double dropout, QkvValue **weights, GError **error);
/**
 * qkv_build_mha_masked:
 * @b: a #QkvBuilder
 * @name: the name
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @valid_lens: (nullable): a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @kind: the kind
 * @causal: the causal
 * @dropout: the dropout
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same with a mask (may be NULL) of the given kind for the attention
 * scores (qkv_multi_head_attention_masked in qkv-nn.h): a local window, a
 * padding mask or learned ALiBi-style biases.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha_masked(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                               QkvValue *values, gint64 num_hiddens, gint num_heads,
                               QkvValue *valid_lens, QkvValue *mask, QkvMaskKind kind,
                               gboolean causal, double dropout, QkvValue **weights, GError **error);
/**
 * QkvMhaOptions:
 *
 * How qkv_build_mha_full() attends; zero-initialise it (designated
 * initialisers do): all zero is qkv_build_mha() with no lengths, no mask, no
 * dropout and no biases.
 */
typedef struct {
  QkvValue *valid_lens;  /* i32 (B) or (B, n_q), or NULL (qkv_masked_softmax) */
  QkvValue *mask;        /* NULL, or a mask of mask_kind for the scores */
  QkvMaskKind mask_kind; /* QKV_MASK_BOOLEAN by default */
  gboolean causal;
  double dropout; /* on the attention weights, in [0, 1) */
  /* TRUE: biases "<name>.W_q.bias", "W_k.bias", "W_v.bias" and "W_o.bias"
   * (num_hiddens each) after the four projections, the nn.Linear(bias=True)
   * of the book's MultiHeadAttention(bias=True); new ones start as
   * nn.Linear's biases do (U(±1/√fan_in), or b->inits->bias). In
   * nn.MultiheadAttention(bias=True) they are in_proj_bias = [W_q.bias;
   * W_k.bias; W_v.bias] and out_proj.bias (whose weights are in_proj_weight
   * = [W_q.weight; W_k.weight; W_v.weight] and out_proj.weight = W_o.weight);
   * PyTorch starts them at 0 (QkvBuilderInits.bias = QKV_INIT_CONSTANT 0
   * does the same). */
  gboolean bias;
  gpointer reserved[4];
} QkvMhaOptions;

/**
 * qkv_build_mha_full:
 * @b: a #QkvBuilder
 * @name: the name
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @options: (nullable): a #QkvMhaOptions
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_mha() with everything optional in options (NULL: all zero).
 * Without biases it builds what qkv_build_mha_masked() builds. With
 * b->cache, a causal self-attention attends over its key/value cache
 * (QkvBuilderCache); *weights is then (B, heads, t, max_len), exactly 0 at
 * the slots a query does not see, and asking for it does not make a step
 * read past the filled slots.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha_full(QkvBuilder *b, const gchar *name, QkvValue *queries, QkvValue *keys,
                             QkvValue *values, gint64 num_hiddens, gint num_heads,
                             const QkvMhaOptions *options, QkvValue **weights, GError **error);

/**
 * qkv_build_mha_keys_values:
 * @b: a #QkvBuilder
 * @name: the name
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @num_hiddens: the num hiddens
 * @num_heads: the num heads
 * @options: (nullable): a #QkvMhaOptions
 * @projected_values: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The keys and values of the attention "<name>" projected and split into
 * heads as it projects them (its W_k, W_v and, with options->bias, their
 * biases; parameters created if missing, as qkv_build_mha_full() would):
 * keys (B, n_k, ·) and values (B, n_k, ·) → (B, heads, n_k, num_hiddens /
 * heads), the projected keys returned and the values in *projected_values.
 * What a cached builder's cross-attention takes with
 * QkvBuilderCache.cross_inputs. On failure NULL and *projected_values NULL.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mha_keys_values(QkvBuilder *b, const gchar *name, QkvValue *keys,
                                    QkvValue *values, gint64 num_hiddens, gint num_heads,
                                    const QkvMhaOptions *options, QkvValue **projected_values,
                                    GError **error);

/**
 * qkv_build_positions:
 * @b: a #QkvBuilder
 * @tokens: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The i32 positions of tokens (B, T): (T) 0 … T − 1 (torch.arange(T)),
 * or in cached mode (b->cache) row b's positions[b] … positions[b] + T − 1
 * as (B, T) (qkv_positions()). For learned position embeddings:
 * qkv_embedding(qkv_build_positions(b, tokens, &error), wpe, &error).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_positions(QkvBuilder *b, QkvValue *tokens, GError **error);

/**
 * QkvActivation:
 * @QKV_ACTIVATION_RELU: the book's
 * @QKV_ACTIVATION_GELU: exact, nn.GELU() (qkv_gelu)
 * @QKV_ACTIVATION_GELU_TANH: nn.GELU(approximate="tanh")
 * @QKV_ACTIVATION_SILU: nn.SiLU() (qkv_silu)
 *
 * The activation between the two dense layers of a position-wise FFN (and
 * of the Transformer's, QkvTransformerConfig.ffn_activation).
 */
typedef enum {
  QKV_ACTIVATION_RELU = 0,  /* the book's */
  QKV_ACTIVATION_GELU,      /* exact, nn.GELU() (qkv_gelu) */
  QKV_ACTIVATION_GELU_TANH, /* nn.GELU(approximate="tanh") */
  QKV_ACTIVATION_SILU,      /* nn.SiLU() (qkv_silu) */
} QkvActivation;

/**
 * qkv_build_ffn:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @ffn_hiddens: the ffn hiddens
 * @out_features: the out features
 * @error: return location for a #GError, or %NULL
 *
 * PositionWiseFFN: "<name>.dense1" (ffn_hiddens), ReLU, "<name>.dense2" (out).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_ffn(QkvBuilder *b, const gchar *name, QkvValue *x, gint64 ffn_hiddens,
                        gint64 out_features, GError **error);
/**
 * qkv_build_ffn_activation:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @ffn_hiddens: the ffn hiddens
 * @out_features: the out features
 * @activation: the activation
 * @error: return location for a #GError, or %NULL
 *
 * The same with another activation, under the same names. ReLU is
 * qkv_build_ffn()'s fused op; the others are two linear layers around the
 * activation's op.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_ffn_activation(QkvBuilder *b, const gchar *name, QkvValue *x,
                                   gint64 ffn_hiddens, gint64 out_features,
                                   QkvActivation activation, GError **error);
/**
 * qkv_build_addnorm:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @y: a #QkvValue
 * @dropout: the dropout
 * @error: return location for a #GError, or %NULL
 *
 * AddNorm: LayerNorm(dropout(y) + x) with "<name>.ln.weight/.bias".
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_addnorm(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *y,
                            double dropout, GError **error);
/**
 * qkv_build_layer_norm:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @eps: the eps
 * @elementwise_affine: the elementwise affine
 * @bias: the bias
 * @error: return location for a #GError, or %NULL
 *
 * nn.LayerNorm(d, eps, elementwise_affine, bias) over the last axis (d) of
 * x: "<name>.weight" (d, ones) unless !elementwise_affine, "<name>.bias"
 * (d, zeros) unless !elementwise_affine or !bias (PyTorch's bias= of 2.1).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_layer_norm(QkvBuilder *b, const gchar *name, QkvValue *x, double eps,
                               gboolean elementwise_affine, gboolean bias, GError **error);
/**
 * qkv_build_rms_norm:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @eps: the eps
 * @error: return location for a #GError, or %NULL
 *
 * nn.RMSNorm(d, eps) over the last axis (d) of x (qkv_rms_norm):
 * "<name>.weight" (d, ones).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_rms_norm(QkvBuilder *b, const gchar *name, QkvValue *x, double eps,
                             GError **error);

/**
 * QkvTieEmbeddings:
 * @QKV_TIE_NONE: separate matrices, the book's model
 * @QKV_TIE_DECODER: the decoder's output projection is "decoder.embedding.weight" (tgt_vocab, d)
 * @QKV_TIE_ALL: a joint vocabulary (src_vocab must equal tgt_vocab): the encoder's embedding, the
 *   decoder's and the output projection are all "encoder.embedding.weight";
 *   "decoder.embedding.weight" does not exist
 *
 * Weight tying (Press & Wolf 2017; "Attention is all you need" §3.4) in the
 * Transformer: one matrix E (vocab, d) is both an embedding table and the
 * output projection, logits = h Eᵀ + "decoder.dense.bias" (PyTorch's
 * convention: tying dense.weight to embedding.weight keeps the Linear's
 * bias, which costs only vocab numbers and lets frequent tokens start
 * ahead). Inputs are still scaled by √d, as without tying. Autodiff sums the
 * gradients of every use of E. The shared matrix is one parameter, stored
 * (and saved in checkpoints) once, under the name given below;
 * "decoder.dense.weight" does not exist.
 */
typedef enum {
  QKV_TIE_NONE = 0, /* separate matrices, the book's model */
  /* the decoder's output projection is "decoder.embedding.weight" (tgt_vocab, d) */
  QKV_TIE_DECODER,
  /* a joint vocabulary (src_vocab must equal tgt_vocab): the encoder's
   * embedding, the decoder's and the output projection are all
   * "encoder.embedding.weight"; "decoder.embedding.weight" does not exist */
  QKV_TIE_ALL,
} QkvTieEmbeddings;

/**
 * QkvTransformerConfig:
 *
 * Zero-initialise it (designated initialisers do): fields added later take
 * their defaults from zero.
 */
typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 num_hiddens;
  gint64 ffn_hiddens;
  gint num_heads;
  gint num_layers;
  double dropout;
  QkvTieEmbeddings tie_embeddings; /* QKV_TIE_NONE by default */
  /* FALSE: the book's post-LN blocks, LayerNorm(x + dropout(sublayer(x)))
   * (addnorm{k}). TRUE: pre-LN blocks, x + dropout(sublayer(LN(x))), as
   * nn.TransformerEncoderLayer(norm_first=True) and its decoder twin: the
   * LayerNorm before sub-layer k keeps its name "addnorm{k}.ln", so a
   * checkpoint has the same names either way; each stack then ends with a
   * LayerNorm of its own, "encoder.norm" and "decoder.norm" (the norm= of
   * nn.TransformerEncoder and nn.TransformerDecoder), the decoder's before
   * its dense layer. (PyTorch's layers also drop out inside the FFN, after
   * the activation; these blocks, like the book's, do not.) */
  gboolean norm_first;
  QkvActivation ffn_activation; /* between the FFN's layers: ReLU by default */
  /* TRUE: every attention has biases (QkvMhaOptions.bias), as
   * nn.MultiheadAttention's default bias=True */
  gboolean attention_bias;
  gpointer reserved[2];
} QkvTransformerConfig;

/**
 * qkv_build_transformer_encoder:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @src: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * TransformerEncoder "encoder": embedding · √d, positional encoding, blocks
 * "encoder.blks.block{i}" (attention, addnorm1, ffn, addnorm2) with the
 * padding mask from valid_lens (i32 (B)). src (B, T) i32 → (B, T, d).
 * With cfg->norm_first, pre-LN blocks and "encoder.norm" at the end.
 *
 * The names map onto nn.TransformerEncoderLayer's: self_attn.in_proj_weight
 * = [attention.W_q.weight; W_k.weight; W_v.weight] (in_proj_bias alike with
 * attention_bias), self_attn.out_proj = attention.W_o, linear1 = ffn.dense1,
 * linear2 = ffn.dense2, norm1 = addnorm1.ln, norm2 = addnorm2.ln (in the
 * decoder: self_attn = attention1, multihead_attn = attention2, norm3 =
 * addnorm3.ln).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_encoder(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                        QkvValue *src, QkvValue *valid_lens, GError **error);
/**
 * qkv_build_transformer_decoder:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @tgt: a #QkvValue
 * @enc_outputs: a #QkvValue
 * @enc_valid_lens: (nullable): a #QkvValue
 * @cross_weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * TransformerDecoder "decoder" over a whole target prefix: embedding · √d,
 * positional encoding (positions 0…T-1), blocks "decoder.blks.block{i}" with
 * causal self-attention attention1, encoder-decoder attention attention2,
 * ffn and addnorm1..3, then "decoder.dense" → logits (B, T, tgt_vocab)
 * (with cfg->tie_embeddings, the embedding matrix transposed and
 * "decoder.dense.bias").
 * cross_weights (may be NULL) receives the last block's encoder-decoder
 * attention weights (B, heads, T, T_src). With b->cache (QkvBuilderCache)
 * it is the step decoder's graph: tgt holds each row's new tokens at
 * b->cache->positions, and attention1 attends over its key/value cache.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_decoder(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                        QkvValue *tgt, QkvValue *enc_outputs,
                                        QkvValue *enc_valid_lens, QkvValue **cross_weights,
                                        GError **error);

/**
 * QkvTransformerTaps:
 *
 * Intermediates of the Transformer builders, for looking at them. Each
 * array the caller sets (non-NULL) must have cfg->num_layers slots; slot i
 * receives block i's attention weights (B, heads, n_q, n_k), before dropout.
 * On failure every slot asked for is NULL.
 */
typedef struct {
  /* encoder: self-attention (B, heads, T, T); decoder: the causal
   * self-attention attention1 (B, heads, T, T) */
  QkvValue **self_weights;
  /* decoder only: encoder-decoder attention attention2 (B, heads, T, T_src) */
  QkvValue **cross_weights;
  gpointer reserved[4];
} QkvTransformerTaps;

/**
 * qkv_build_transformer_encoder_taps:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @src: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @taps: (nullable): a #QkvTransformerTaps
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_transformer_encoder() that also fills taps (may be NULL).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_encoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *src, QkvValue *valid_lens,
                                             QkvTransformerTaps *taps, GError **error);
/**
 * qkv_build_transformer_decoder_taps:
 * @b: a #QkvBuilder
 * @cfg: a #QkvTransformerConfig
 * @tgt: a #QkvValue
 * @enc_outputs: a #QkvValue
 * @enc_valid_lens: (nullable): a #QkvValue
 * @taps: (nullable): a #QkvTransformerTaps
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_transformer_decoder() that fills taps (may be NULL) instead of
 * returning only the last block's cross-attention weights.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_transformer_decoder_taps(QkvBuilder *b, const QkvTransformerConfig *cfg,
                                             QkvValue *tgt, QkvValue *enc_outputs,
                                             QkvValue *enc_valid_lens, QkvTransformerTaps *taps,
                                             GError **error);

/**
 * qkv_build_gru:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: (nullable): a #QkvValue
 * @h0: (nullable): a #QkvValue
 * @hidden: the hidden
 * @num_layers: the num layers
 * @dropout: the dropout
 * @h_n: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * nn.GRU with PyTorch's gate equations and parameter layout:
 * "<name>.weight_ih_l{k}" (3H, in), "<name>.weight_hh_l{k}" (3H, H),
 * "<name>.bias_ih_l{k}", "<name>.bias_hh_l{k}" (3H), gates ordered r, z, n;
 * dropout on every layer's output but the last. x (T, B, in), h0 (L, B, H)
 * or NULL for zeros → outputs (T, B, H); *h_n (may be NULL) gets (L, B, H).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden,
                        gint num_layers, double dropout, QkvValue **h_n, GError **error);

/**
 * QkvGruSeq2SeqConfig:
 *
 * A gru seq2 seq config.
 */
typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 embed_size;
  gint64 num_hiddens;
  gint num_layers;
  double dropout;
} QkvGruSeq2SeqConfig;

/**
 * qkv_build_bahdanau_seq2seq:
 * @b: a #QkvBuilder
 * @cfg: a #QkvGruSeq2SeqConfig
 * @src: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @dec_in: a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The book's Seq2SeqEncoder ("encoder.embedding", "encoder.rnn") and
 * Seq2SeqAttentionDecoder ("decoder.attention.W_k/W_q/w_v", "decoder.embedding",
 * "decoder.rnn", "decoder.dense") unrolled over the time steps, with teacher
 * forcing on dec_in (B, T). src (B, T), src_valid (B) → logits (B, T, V).
 * *weights (may be NULL) receives the attention weights (B, T, T_src).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_bahdanau_seq2seq(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                                     QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                                     GError **error);

/**
 * QkvSeq2SeqTaps:
 *
 * Intermediates of qkv_build_bahdanau_seq2seq_taps(); all NULL on failure.
 */
typedef struct {
  QkvValue *enc_outputs;       /* the encoder GRU's outputs, (B, T_src, H) */
  QkvValue *enc_state;         /* its final hidden state, (L, B, H) */
  QkvValue *attention_weights; /* as *weights below, (B, T, T_src) */
  gpointer reserved[4];
} QkvSeq2SeqTaps;

/**
 * qkv_build_bahdanau_seq2seq_taps:
 * @b: a #QkvBuilder
 * @cfg: a #QkvGruSeq2SeqConfig
 * @src: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @dec_in: a #QkvValue
 * @taps: (nullable): a #QkvSeq2SeqTaps
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_bahdanau_seq2seq() that fills taps (may be NULL).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_bahdanau_seq2seq_taps(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg,
                                          QkvValue *src, QkvValue *src_valid, QkvValue *dec_in,
                                          QkvSeq2SeqTaps *taps, GError **error);

/**
 * QkvLuongScore:
 * @QKV_LUONG_DOT: h_tᵀ h̄_s (no parameters, no 1/√d scaling)
 * @QKV_LUONG_GENERAL: h_tᵀ W_a h̄_s; "<name>.W_a.weight" (H, H)
 * @QKV_LUONG_CONCAT: v_aᵀ tanh(W_a [h_t; h̄_s]); "<name>.W_a.weight" (H, 2H), whose first H columns
 *   take h_t, and "<name>.v_a.weight" (1, H)
 *
 * ---- Luong attention (Luong, Pham & Manning 2015, "Effective Approaches
 * to Attention-based Neural Machine Translation") ---------------------------
 *
 * A decoder state h_t (a query) scores every source state h̄_s (the encoder's
 * outputs), the scores go through a softmax over the source positions (a
 * masked softmax: positions at or past the sentence's valid length and, for
 * local attention, outside the window are masked as the book masks padding),
 * and the context c_t is the weighted sum of the h̄_s.
 */
typedef enum {
  QKV_LUONG_DOT,     /* h_tᵀ h̄_s (no parameters, no 1/√d scaling) */
  QKV_LUONG_GENERAL, /* h_tᵀ W_a h̄_s; "<name>.W_a.weight" (H, H) */
  /* v_aᵀ tanh(W_a [h_t; h̄_s]); "<name>.W_a.weight" (H, 2H), whose first H
   * columns take h_t, and "<name>.v_a.weight" (1, H) */
  QKV_LUONG_CONCAT,
} QkvLuongScore;

/**
 * QkvLuongAlign:
 * @QKV_LUONG_GLOBAL: every source position
 * @QKV_LUONG_LOCAL_M: local-m: the positions s with |s − p_t| ≤ D, p_t = min(t, S − 1) for the
 *   query at target position t (the paper's p_t = t, held at the sentence's last word so that a
 *   target longer than its source still sees one)
 * @QKV_LUONG_LOCAL_P: local-p: p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) ∈ [0, S], the positions |s −
 *   p_t| ≤ D, and the softmax's weights then multiplied (not renormalised, as in the paper's eq.
 *   10) by exp(−(s − p_t)² / (2σ²)), σ = D / 2; "<name>.W_p.weight" (H, H), "<name>.v_p.weight" (1,
 *   H). The window's edge passes no gradient; the Gaussian trains W_p and v_p.
 *
 * The luong align values.
 */
typedef enum {
  QKV_LUONG_GLOBAL, /* every source position */
  /* local-m: the positions s with |s − p_t| ≤ D, p_t = min(t, S − 1) for
   * the query at target position t (the paper's p_t = t, held at the
   * sentence's last word so that a target longer than its source still
   * sees one) */
  QKV_LUONG_LOCAL_M,
  /* local-p: p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) ∈ [0, S], the positions
   * |s − p_t| ≤ D, and the softmax's weights then multiplied (not
   * renormalised, as in the paper's eq. 10) by exp(−(s − p_t)² / (2σ²)),
   * σ = D / 2; "<name>.W_p.weight" (H, H), "<name>.v_p.weight" (1, H). The
   * window's edge passes no gradient; the Gaussian trains W_p and v_p. */
  QKV_LUONG_LOCAL_P,
} QkvLuongAlign;

/**
 * QkvLuongAttentionConfig:
 *
 * S above is the source sentence's own length, its valid length (the book's
 * valid lengths count <eos>), so p_t follows each sentence and not the
 * padded T_src; with no valid lengths it is T_src. Positions count from 0.
 */
typedef struct {
  QkvLuongScore score;
  QkvLuongAlign align;
  gint window; /* D, >= 1 for the local alignments; ignored for global */
  gpointer reserved[2];
} QkvLuongAttentionConfig;

/**
 * qkv_build_luong_attention:
 * @b: a #QkvBuilder
 * @name: the name
 * @cfg: a #QkvLuongAttentionConfig
 * @queries: a #QkvValue
 * @source: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @first_position: the first position
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Luong attention of queries (B, n_q, H) over source (B, S, H) (keys and
 * values both, as in the paper), with the parameters of cfg->score and
 * cfg->align under name ("decoder.attention"). src_valid: i32 (B) or NULL.
 * Query i sits at target position first_position + i (local-m reads it).
 * → context (B, n_q, H); *weights (may be NULL) receives the alignment
 * weights (B, n_q, S), the Gaussian included for local-p.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_luong_attention(QkvBuilder *b, const gchar *name,
                                    const QkvLuongAttentionConfig *cfg, QkvValue *queries,
                                    QkvValue *source, QkvValue *src_valid, gint64 first_position,
                                    QkvValue **weights, GError **error);
/**
 * qkv_build_luong_attentional:
 * @b: a #QkvBuilder
 * @name: the name
 * @context: a #QkvValue
 * @h: a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The attentional vector ã_t = tanh(W_c [c_t; h_t]) with no bias (eq. 5),
 * W_c "<name>.weight" (H, H_c + H): context (…, H_c), h (…, H) → (…, H).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_luong_attentional(QkvBuilder *b, const gchar *name, QkvValue *context,
                                      QkvValue *h, GError **error);

/**
 * QkvLuongConfig:
 *
 * A luong config.
 */
typedef struct {
  gint64 src_vocab;
  gint64 tgt_vocab;
  gint64 embed_size;
  gint64 num_hiddens;
  gint num_layers;
  double dropout; /* between GRU layers, as nn.GRU's */
  QkvLuongAttentionConfig attention;
  /* feed ã_{t-1} to the next step: the decoder GRU's input is
   * [embedding; ã_{t-1}] (E + H), with ã_0 = 0 */
  gboolean input_feeding;
  gpointer reserved[4];
} QkvLuongConfig;

/**
 * qkv_build_luong_seq2seq:
 * @b: a #QkvBuilder
 * @cfg: a #QkvLuongConfig
 * @src: a #QkvValue
 * @src_valid: (nullable): a #QkvValue
 * @dec_in: a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * A Luong seq2seq on the book's GRU encoder ("encoder.embedding",
 * "encoder.rnn", as qkv_build_bahdanau_seq2seq's): the decoder GRU
 * "decoder.rnn" starts from the encoder's final state and reads
 * "decoder.embedding" (plus ã_{t-1} with input feeding); its top layer's
 * h_t attends ("decoder.attention", qkv_build_luong_attention) over the
 * encoder's outputs, "decoder.W_c" makes ã_t
 * (qkv_build_luong_attentional) and "decoder.dense" (with bias) the
 * logits. Teacher forcing on dec_in (B, T); src (B, T_src), src_valid (B)
 * → logits (B, T, V); *weights (may be NULL) receives (B, T, T_src). Without
 * input feeding the decoder GRU runs over all steps before attending; with
 * it, step by step.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_luong_seq2seq(QkvBuilder *b, const QkvLuongConfig *cfg, QkvValue *src,
                                  QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                                  GError **error);

/**
 * qkv_build_seq2seq_loss:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @error: return location for a #GError, or %NULL
 *
 * The book's MaskedSoftmaxCELoss summed over the batch: Σ_b mean_t(ce[b,t] ·
 * mask[b,t]) for logits (B, T, V), labels i32 (B, T), mask f32 (B, T).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss(QkvValue *logits, QkvValue *labels, QkvValue *mask,
                                 GError **error);
/**
 * qkv_build_seq2seq_loss_lens:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @per_seq: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same from i32 valid lengths (B), as the book's MaskedSoftmaxCELoss
 * takes them: the mask is sequence_mask(valid_lens) over labels' T, built in
 * the graph. *per_seq (may be NULL) receives the per-sequence loss (B),
 * mean_t(ce · mask); the return value is its sum. The mean divides by the T
 * a plan is bound with, so the loss follows shorter sequences.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss_lens(QkvValue *logits, QkvValue *labels, QkvValue *valid_lens,
                                      QkvValue **per_seq, GError **error);
/**
 * qkv_build_seq2seq_loss_smoothed:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @label_smoothing: the label smoothing
 * @error: return location for a #GError, or %NULL
 *
 * qkv_build_seq2seq_loss and _lens with label smoothing ε in [0, 1] in the
 * cross-entropy (qkv_cross_entropy_smoothed, "Attention is all you need"
 * trains with ε = 0.1). ε = 0 gives the unsmoothed loss.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss_smoothed(QkvValue *logits, QkvValue *labels, QkvValue *mask,
                                          double label_smoothing, GError **error);
/**
 * qkv_build_seq2seq_loss_lens_smoothed:
 * @logits: a #QkvValue
 * @labels: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @label_smoothing: the label smoothing
 * @per_seq: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_build_seq2seq_loss_smoothed().
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_seq2seq_loss_lens_smoothed(QkvValue *logits, QkvValue *labels,
                                               QkvValue *valid_lens, double label_smoothing,
                                               QkvValue **per_seq, GError **error);

/**
 * qkv_build_attention_pooling:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @num_queries: the num queries
 * @key_size: the key size
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Attention pooling with learned queries and scaled dot-product scores:
 * num_queries query vectors
 * "<name>.queries" (K, key_size), N(0, 1), attend over the T word vectors of
 * each sequence in x (B, T, D) f32, whose keys are "<name>.W_k" (no bias:
 * weight (key_size, D)) applied to them:
 *   scores = queries · (x W_kᵀ)ᵀ / √key_size                      (B, K, T)
 *   weights = masked_softmax(scores, valid_lens)                  (B, K, T)
 *   output = weights · x                                          (B, K, D)
 * Row k of the output is the weighted average of the word vectors under
 * query k. valid_lens (i32 (B), or NULL: every position counts) masks the
 * padding as masked_softmax does: a position ≥ the valid length gets weight
 * 0 exactly (a sequence of length 0 gets uniform weights, as in the book).
 * *weights (may be NULL) receives the weights (B, K, T). Follows the shapes
 * a plan is bound with (a shorter T, a partial batch).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x,
                                      QkvValue *valid_lens, gint num_queries, gint64 key_size,
                                      QkvValue **weights, GError **error);
/**
 * qkv_build_hard_attention_pooling:
 * @b: a #QkvBuilder
 * @name: the name
 * @x: a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @num_queries: the num queries
 * @key_size: the key size
 * @tau: the tau
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Hard attention pooling: as qkv_build_attention_pooling() (the same
 * parameters "<name>.queries" and "<name>.W_k", the same scores), but each
 * query takes one word vector instead of an average:
 *   weights = gumbel_softmax(scores, valid_lens, tau, hard)       (B, K, T)
 * one-hot rows: in plans compiled for training the position is sampled from
 * softmax(scores) (Gumbel-max), in evaluation it is the argmax of the
 * scores. A position ≥ the valid length is never picked (a sequence of
 * length 0 picks nothing and pools to zeros). The pick is not differentiable;
 * training goes through the straight-through Gumbel-softmax estimator: the
 * gradient of the one-hot is taken to be that of softmax((scores + g) / tau)
 * for the same noise g (qkv_gumbel_softmax()). tau finite and > 0 (1 is the
 * usual start); *weights (may be NULL) receives the one-hot weights.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_hard_attention_pooling(QkvBuilder *b, const gchar *name, QkvValue *x,
                                           QkvValue *valid_lens, gint num_queries, gint64 key_size,
                                           double tau, QkvValue **weights, GError **error);
/**
 * qkv_build_mean_pooling:
 * @b: a #QkvBuilder
 * @x: (nullable): a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Mean pooling, the baseline: the average of the valid word vectors of each
 * sequence, as attention pooling with every score equal. x (B, T, D),
 * valid_lens i32 (B) or NULL → (B, 1, D); *weights (may be NULL) receives
 * the uniform weights (B, 1, T). No parameters.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_mean_pooling(QkvBuilder *b, QkvValue *x, QkvValue *valid_lens,
                                 QkvValue **weights, GError **error);

/**
 * QkvPooling:
 * @QKV_POOLING_ATTENTION: attention
 * @QKV_POOLING_MEAN: mean
 * @QKV_POOLING_HARD: qkv_build_hard_attention_pooling()
 *
 * The pooling values.
 */
typedef enum {
  QKV_POOLING_ATTENTION,
  QKV_POOLING_MEAN,
  QKV_POOLING_HARD, /* qkv_build_hard_attention_pooling() */
} QkvPooling;

/**
 * QkvPoolingClassifierConfig:
 *
 * A pooling classifier config.
 */
typedef struct {
  gint64 vocab_size;
  gint64 embed_size;  /* D, the word vectors' size */
  gint64 key_size;    /* attention only (soft or hard) */
  gint num_queries;   /* K, attention only (one per class is the usual choice) */
  gint num_classes;   /* C */
  QkvPooling pooling; /* QKV_POOLING_ATTENTION, QKV_POOLING_MEAN or QKV_POOLING_HARD */
  /* TRUE: the Transformer's sinusoidal positional encoding is added to the
   * word vectors (no parameters), so the pooling can see word order */
  gboolean positional_encoding;
  double tau; /* QKV_POOLING_HARD: the Gumbel-softmax temperature (0: 1) */
  gpointer reserved[3];
} QkvPoolingClassifierConfig;

/**
 * qkv_build_pooling_classifier:
 * @b: a #QkvBuilder
 * @cfg: a #QkvPoolingClassifierConfig
 * @tokens: (nullable): a #QkvValue
 * @valid_lens: (nullable): a #QkvValue
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * A sentence classifier: "embedding" (vocab_size, D), then attention pooling
 * "pool" (pool.queries, pool.W_k.weight; soft, or hard for
 * QKV_POOLING_HARD) or mean pooling, the K pooled
 * vectors concatenated into one feature [c_1; …; c_K] (B, K·D) (K = 1 for
 * mean pooling), and "dense" (weight (C, K·D), bias (C)) to the class logits.
 * tokens i32 (B, T), valid_lens i32 (B) or NULL → logits (B, C). *weights
 * (may be NULL) receives the pooling weights (B, K, T).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_pooling_classifier(QkvBuilder *b, const QkvPoolingClassifierConfig *cfg,
                                       QkvValue *tokens, QkvValue *valid_lens, QkvValue **weights,
                                       GError **error);

/**
 * qkv_build_nw_regression:
 * @graph: a #QkvGraph
 * @params: a #QkvParams
 * @prefix: the prefix
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @seed: the seed
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Nadaraya-Watson kernel regression with one learned width w (parameter
 * "<prefix>w", shape (1)): for each query q_i,
 *   f(q_i) = Σ_j softmax_j(-((q_i - k_ij) · w)² / 2) · v_ij.
 * queries (n), keys (n, m), values (n, m) → predictions (n). If the store has
 * no "<prefix>w" yet it is created as U(0, 1) from seed, like torch.rand.
 * *weights (may be NULL) receives the attention weights (n, m).
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_nw_regression(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                                  QkvValue *queries, QkvValue *keys, QkvValue *values, guint64 seed,
                                  QkvValue **weights, GError **error);
/**
 * qkv_build_nw_regression_masked:
 * @graph: a #QkvGraph
 * @params: a #QkvParams
 * @prefix: the prefix
 * @queries: a #QkvValue
 * @keys: a #QkvValue
 * @values: a #QkvValue
 * @mask: (nullable): a #QkvValue
 * @seed: the seed
 * @weights: (out) (optional) (nullable) (transfer none): where to store a #QkvValue, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * The same with a boolean mask (f32 0/1, broadcast to (n, m); may be NULL):
 * a 0 leaves key j out of query i's softmax, as QKV_MASK_BOOLEAN does in
 * masked_softmax — the book's training, where each point attends to every
 * other point but itself.
 *
 * Returns: (transfer none) (nullable): a #QkvValue, or %NULL with @error set
 */
QKV_API
QkvValue *qkv_build_nw_regression_masked(QkvGraph *graph, QkvParams *params, const gchar *prefix,
                                         QkvValue *queries, QkvValue *keys, QkvValue *values,
                                         QkvValue *mask, guint64 seed, QkvValue **weights,
                                         GError **error);

G_END_DECLS
