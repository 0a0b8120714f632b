/* qkv-decode.h: generating output sequences from a trained seq2seq model.
 *
 * Two halves that meet in one callback:
 *  - qkv_beam_search() is the search: beam search with the length penalty of
 *    Wu et al. (2016), greedy decoding as beam size 1. It knows nothing of
 *    models; each step it asks a QkvDecodeStepFunc for the next-token scores
 *    of every row it keeps.
 *  - A QkvStepDecoder is a model that answers that callback one token at a
 *    time: a compiled decode-step graph built from the same parameters as the
 *    training graph, run once per emitted token, keeping what the model
 *    carries from step to step (the Transformer's per-layer self-attention
 *    keys and values and its cross-attention keys and values; the Bahdanau
 *    and Luong decoders' GRU state), so a token costs the same at step 50 as
 *    at step 1.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-builders.h"
#include "qkv-plan.h"
#include "qkv-tensor.h"

G_BEGIN_DECLS

/**
 * QkvDecodeStepFunc:
 * @user_data: data given with the callback
 * @step: the step
 * @tokens: the tokens
 * @parents: the parents
 * @n_rows: the n rows
 * @logits: the logits
 * @error: return location for a #GError
 *
 * One decoding step for n_rows rows (sentences × beam slots, row r belongs
 * to sentence r / beam_size). Before reading tokens the model moves its
 * per-row state: row r continues the history of row parents[r] of the
 * previous step (at step 0, parents[r] == r). tokens[r] is the token row r
 * feeds at position step (<bos> at step 0). The callback writes n_rows ×
 * vocab scores to logits, row after row: logits or log-probabilities (the
 * search takes a log-softmax of each row, which leaves log-probabilities as
 * they are). Scores of rows that hold a live hypothesis must be finite or
 * -inf (a token that cannot follow). Returns FALSE with error set to stop
 * the search.
 *
 * Returns: as described above
 */
typedef gboolean (*QkvDecodeStepFunc)(gpointer user_data, gint step, const gint32 *tokens,
                                      const gint32 *parents, gint n_rows, float *logits,
                                      GError **error);

/**
 * QkvBeamOptions:
 *
 * A beam options.
 */
typedef struct {
  /* k ≥ 1: hypotheses kept per sentence; 1 is greedy decoding. */
  gint beam_size;
  /* α ≥ 0 of the length penalty lp(Y) = ((5 + |Y|) / 6)^α: a finished
   * hypothesis ranks by log P(Y) / lp(Y), |Y| counting its tokens with <eos>.
   * 0 ranks by log P(Y) alone. The Transformer paper decodes with k = 4,
   * α = 0.6. */
  double length_penalty;
  /* Tokens generated at most per sentence, <eos> included (≥ 1). */
  gint max_len;
  /* Scores per row that the callback writes. */
  gint64 vocab;
  /* Token ids in [0, vocab): fed at step 0, and ending a hypothesis. */
  gint32 bos, eos;
  gpointer reserved[4];
} QkvBeamOptions;

/**
 * qkv_beam_options_default: (skip)
 *
 * k = 4, α = 0.6 (the Transformer paper's), max_len 0 and vocab 0 (set
 * them), bos 1, eos 2.
 *
 * Returns: the #QkvBeamOptions
 */
QKV_API
QkvBeamOptions qkv_beam_options_default(void);

/**
 * qkv_beam_search: (skip)
 * @options: a #QkvBeamOptions
 * @batch: the batch
 * @step: (scope call) (closure user_data): a #QkvDecodeStepFunc
 * @user_data: (closure): data for the callback
 * @out_tokens: the out tokens
 * @out_lengths: (out) (optional): where to store the out lengths, or %NULL
 * @out_scores: (out) (optional): where to store the out scores, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Decode batch sentences together. Each step calls step once for batch ×
 * beam_size rows; from each sentence's live hypotheses it extends the
 * 2 · beam_size best by total log-probability: an <eos> among the first
 * beam_size of them ends that hypothesis (its score is divided by the length
 * penalty), the first beam_size others stay live. A sentence is done when
 * beam_size hypotheses have ended; the search stops when every sentence is
 * done or after max_len steps, when the live hypotheses count as ended (|Y| =
 * max_len, no <eos>). With beam_size 1 this is greedy decoding: the argmax
 * at every step (the lowest token id on a tie), stopping at <eos>.
 *
 * A sentence that is done keeps its rows in later calls (fed <eos>, parents
 * their own rows); their scores are ignored.
 *
 * Out: out_tokens (batch × max_len) gets each sentence's best hypothesis
 * without <bos> and <eos>, followed by eos up to max_len; out_lengths
 * (batch) its token count (without <eos>); out_scores (batch, may be NULL)
 * its score log P(Y) / lp(Y). Everything the search needs is allocated before
 * the first step. Returns FALSE with QKV_ERROR_INVALID_ARGUMENT for a bad
 * option (naming it), QKV_ERROR_INVALID_ARGUMENT naming the step when the
 * callback writes NaN or +inf for a live hypothesis or only -inf for every
 * live hypothesis of a sentence (a single hypothesis whose row is -inf only
 * is dropped), QKV_ERROR_MEMORY when those buffers (about 8 · batch ·
 * beam_size · max_len bytes for the histories, 4 · batch · beam_size · vocab
 * for the scores) cannot be had, or the callback's error; the outputs are
 * not written then.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_beam_search(const QkvBeamOptions *options, gint batch, QkvDecodeStepFunc step,
                         gpointer user_data, gint32 *out_tokens, gint *out_lengths,
                         double *out_scores, GError **error);

/**
 * qkv_beam_length_penalty:
 * @length: the length
 * @alpha: the alpha
 *
 * ((5 + length) / 6)^alpha.
 *
 * Returns: the double
 */
QKV_API
double qkv_beam_length_penalty(gint length, double alpha);

/**
 * QkvStepDecoder:
 *
 * Threads: a step decoder decodes for one thread at a time.
 * qkv_step_decoder_start(), _step() and _translate() called while another
 * thread is in one of them on the same decoder fail at once with
 * QKV_ERROR_BUSY and change nothing (translate holds the decoder for its
 * whole search). Steps from two threads that interleave with each other's
 * start or steps are refused by the step order check
 * (QKV_ERROR_INVALID_ARGUMENT). Decoders over one parameter store only read
 * it: different decoders, and plans, may run in different threads at once.
 * qkv_step_decoder_cross_weights() is valid until the next step from any
 * thread; free a decoder when no thread uses it.
 */
typedef struct _QkvStepDecoder QkvStepDecoder;

/**
 * qkv_step_decoder_new_transformer: (skip)
 * @params: a #QkvParams
 * @config: a #QkvTransformerConfig
 * @max_rows: the max rows
 * @src_len: the src len
 * @max_len: the max len
 * @n_threads: the n threads
 * @error: return location for a #GError, or %NULL
 *
 * A step decoder for the book's Transformer (qkv_build_transformer_encoder
 * and _decoder, same parameter names) whose parameters are in params: the
 * encoder and every layer's cross-attention keys and values run once per
 * sentence, then one plan run per token. Compiled for max_rows rows (batch ×
 * beam size), sources of src_len tokens and up to max_len decoded tokens
 * (the self-attention cache length, below G_MAXINT). Every parameter must be
 * in params already (QKV_ERROR_NOT_FOUND naming the first one missing).
 * Sizes whose buffers (max_rows × src_len × heads × src_len encoder scores,
 * max_rows × max_len × num_hiddens caches, max_rows × tgt_vocab logits)
 * would not fit the address space are refused before anything is built
 * (QKV_ERROR_MEMORY naming them). n_threads 0: the library's default.
 * Evaluation mode: no dropout.
 *
 * Returns: (transfer full) (nullable): a new #QkvStepDecoder, or %NULL with @error set
 */
QKV_API
QkvStepDecoder *qkv_step_decoder_new_transformer(QkvParams *params,
                                                 const QkvTransformerConfig *config, gint max_rows,
                                                 gint64 src_len, gint max_len, gint n_threads,
                                                 GError **error);
/**
 * qkv_step_decoder_new_bahdanau: (skip)
 * @params: a #QkvParams
 * @config: a #QkvGruSeq2SeqConfig
 * @max_rows: the max rows
 * @src_len: the src len
 * @max_len: the max len
 * @n_threads: the n threads
 * @error: return location for a #GError, or %NULL
 *
 * The same for the book's GRU encoder and Bahdanau-attention decoder
 * (qkv_build_bahdanau_seq2seq): the encoder runs once per sentence, then
 * each step runs attention, the decoder GRU and the dense layer on the
 * recurrent state the previous step left. max_len only bounds the steps.
 * The encoder is unrolled over the source: src_len × num_layers above
 * G_MAXUINT / 32 is refused (QKV_ERROR_INVALID_ARGUMENT naming src_len), as
 * are sizes whose buffers would not fit the address space
 * (QKV_ERROR_MEMORY). The same holds for Luong's decoder below.
 *
 * Returns: (transfer full) (nullable): a new #QkvStepDecoder, or %NULL with @error set
 */
QKV_API
QkvStepDecoder *qkv_step_decoder_new_bahdanau(QkvParams *params, const QkvGruSeq2SeqConfig *config,
                                              gint max_rows, gint64 src_len, gint max_len,
                                              gint n_threads, GError **error);
/**
 * qkv_step_decoder_new_luong: (skip)
 * @params: a #QkvParams
 * @config: a #QkvLuongConfig
 * @max_rows: the max rows
 * @src_len: the src len
 * @max_len: the max len
 * @n_threads: the n threads
 * @error: return location for a #GError, or %NULL
 *
 * The same for Luong's model (qkv_build_luong_seq2seq, any score and
 * alignment, with or without input feeding): each step runs the decoder
 * GRU's layers on the state the previous step left (and ã_{t-1} with input
 * feeding), attention and the output layers; local-m's window is centred on
 * the step.
 *
 * Returns: (transfer full) (nullable): a new #QkvStepDecoder, or %NULL with @error set
 */
QKV_API
QkvStepDecoder *qkv_step_decoder_new_luong(QkvParams *params, const QkvLuongConfig *config,
                                           gint max_rows, gint64 src_len, gint max_len,
                                           gint n_threads, GError **error);
/**
 * qkv_step_decoder_free:
 * @decoder: a #QkvStepDecoder
 *
 * See qkv_step_decoder_new_luong().
 */
QKV_API
void qkv_step_decoder_free(QkvStepDecoder *decoder);

/**
 * qkv_step_decoder_start:
 * @decoder: a #QkvStepDecoder
 * @src: a #QkvTensor
 * @src_valid: (nullable): a #QkvTensor
 * @rows_per_sentence: the rows per sentence
 * @error: return location for a #GError, or %NULL
 *
 * Encode a batch of sentences: src i32 (n, src_len) or narrower (the rest is
 * padded), src_valid i32 (n), and repeat each sentence's encoding on
 * rows_per_sentence rows (the beam size), n · rows_per_sentence ≤ max_rows.
 * Resets the step count.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_step_decoder_start(QkvStepDecoder *decoder, const QkvTensor *src,
                                const QkvTensor *src_valid, gint rows_per_sentence, GError **error);
/**
 * qkv_step_decoder_step: (skip)
 * @decoder: the decoder
 * @step: the step
 * @tokens: the tokens
 * @parents: (array length=n_rows) (nullable): the parents, @n_rows of them
 * @n_rows: the number of @parents
 * @logits: (out) (optional): where to store the logits, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * A QkvDecodeStepFunc with user_data the decoder: n_rows must be what
 * qkv_step_decoder_start() set up, step the number of steps since (one call
 * per step, in order), step < max_len. parents may be NULL (each row its
 * own). logits gets (n_rows, vocab).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_step_decoder_step(gpointer decoder, gint step, const gint32 *tokens,
                               const gint32 *parents, gint n_rows, float *logits, GError **error);
/**
 * qkv_step_decoder_translate: (skip)
 * @decoder: a #QkvStepDecoder
 * @src: a #QkvTensor
 * @src_valid: (nullable): a #QkvTensor
 * @options: (nullable): a #QkvBeamOptions
 * @out_tokens: the out tokens
 * @out_lengths: (out) (optional): where to store the out lengths, or %NULL
 * @out_scores: (out) (optional): where to store the out scores, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Encode src and search (qkv_step_decoder_start(), then qkv_beam_search()
 * with options->beam_size rows per sentence). QKV_ERROR_INVALID_ARGUMENT,
 * before anything runs, when options' vocab is not the decoder's, max_len
 * is above the decoder's, or bos or eos is not a token id below vocab.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_step_decoder_translate(QkvStepDecoder *decoder, const QkvTensor *src,
                                    const QkvTensor *src_valid, const QkvBeamOptions *options,
                                    gint32 *out_tokens, gint *out_lengths, double *out_scores,
                                    GError **error);
/**
 * qkv_step_decoder_cross_weights:
 * @decoder: a #QkvStepDecoder
 * @layer: the layer
 *
 * The last step's encoder-decoder attention weights of block layer (-1: the
 * last; the Bahdanau and Luong decoders have one attention, layer 0 or -1):
 * (max_rows, heads, src_len) for the Transformer, (max_rows, 1, src_len) for
 * Bahdanau and Luong.
 * Valid until the next step; NULL before the first step or for a bad layer.
 *
 * Returns: (transfer none) (nullable): a #QkvTensor
 */
QKV_API
const QkvTensor *qkv_step_decoder_cross_weights(QkvStepDecoder *decoder, gint layer);
/**
 * qkv_step_decoder_vocab:
 * @decoder: a #QkvStepDecoder
 *
 * The vocabulary size (columns of the logits).
 *
 * Returns: the gint64
 */
QKV_API
gint64 qkv_step_decoder_vocab(const QkvStepDecoder *decoder);
/**
 * qkv_step_decoder_set_precision:
 * @decoder: a #QkvStepDecoder
 * @precision: the precision
 *
 * The precision of the decoder's matrix products (QkvPrecision, qkv-plan.h)
 * from the next start or step on: the encoder's and every step's, those of
 * the per-step attention over the cache included. QKV_PRECISION_FP32 when
 * new. Under QKV_PRECISION_BF16 a decoder of a model trained with bf16
 * products computes as its training's forward did. Set it between
 * sentences: a sentence encoded in one precision and stepped in the other
 * mixes them. Like qkv_plan_set_precision(), no QKV_ERROR_BUSY guard: call
 * it from the thread that decodes, or with no start, step or translate in
 * flight. A value that is not a QkvPrecision leaves the precision unchanged
 * and logs a critical: a value a user gives goes to
 * qkv_step_decoder_try_set_precision().
 */
QKV_API
void qkv_step_decoder_set_precision(QkvStepDecoder *decoder, QkvPrecision precision);
/**
 * qkv_step_decoder_try_set_precision:
 * @decoder: a #QkvStepDecoder
 * @precision: the precision
 * @error: return location for a #GError, or %NULL
 *
 * qkv_step_decoder_set_precision() that refuses a value that is not a
 * QkvPrecision (QKV_PRECISION_FP32 or QKV_PRECISION_BF16) with
 * QKV_ERROR_INVALID_ARGUMENT naming it (neither of the decoder's plans
 * changed).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_step_decoder_try_set_precision(QkvStepDecoder *decoder, QkvPrecision precision,
                                            GError **error);
/**
 * qkv_step_decoder_get_precision:
 * @decoder: a #QkvStepDecoder
 *
 * See qkv_step_decoder_set_precision().
 *
 * Returns: the #QkvPrecision
 */
QKV_API
QkvPrecision qkv_step_decoder_get_precision(const QkvStepDecoder *decoder);

/* ---- sampling and generation ----------------------------------------------
 *
 * qkv_sample_logits() draws one token per row of logits: greedy, or from
 * softmax(logits / temperature) restricted by top-k and top-p. Its random
 * numbers are counter-based (qkv_random_uniform()): a row's draw depends only
 * on the seed, the step and the row's id, never on the thread count, the
 * other rows or the order of the calls, so the same seed gives the same
 * tokens on every run. qkv_generate() is the loop around it: it feeds
 * prompts through a QkvDecodeStepFunc one token per step and samples each
 * row's continuation until its stop token or a length limit. */

/**
 * QkvSampleOptions:
 *
 * A sample options.
 */
typedef struct {
  /* T ≥ 0, finite. 0 is greedy decoding: the argmax of each row, the
   * lowest token id on a tie (as torch.argmax), and top_k, top_p and seed do
   * not matter. Otherwise tokens are drawn from softmax(logits / T). */
  double temperature;
  /* k ≥ 0: keep the tokens whose logit is at least the k-th largest (so
   * every token tied with the k-th is kept, as Hugging Face's
   * TopKLogitsWarper does). 0, or k at least the number of tokens whose
   * logit is not -inf, keeps them all. */
  gint top_k;
  /* p in (0, 1]: nucleus sampling after top-k, over the distribution that
   * top-k left (renormalised). Tokens are ranked by logit, ties by lower id
   * first; a token is kept while the probability of the tokens ranked before
   * it is below p (Hugging Face's TopPLogitsWarper), so the first token
   * always is and the one that makes the total reach p is too. 1 keeps all. */
  double top_p;
  /* Keys the random numbers. */
  guint64 seed;
  gpointer reserved[4];
} QkvSampleOptions;

/**
 * qkv_sample_options_default: (skip)
 *
 * temperature 1, top_k 0, top_p 1 (plain sampling from the softmax), seed 0.
 *
 * Returns: the #QkvSampleOptions
 */
QKV_API
QkvSampleOptions qkv_sample_options_default(void);

/**
 * qkv_sample_logits:
 * @options: a #QkvSampleOptions
 * @logits: (array length=n_rows): the logits, @n_rows of them
 * @n_rows: the number of @logits
 * @vocab: the vocab
 * @step: the step
 * @row_ids: the row ids
 * @tokens_out: the tokens out
 * @error: return location for a #GError, or %NULL
 *
 * One token per row of logits (n_rows × vocab floats, row after row) into
 * tokens_out[r]. Row r's draw comes from the uniform of (options->seed,
 * step, row_ids[r]): pass a sequence's own id in row_ids so that its draws
 * do not change when other sequences join or leave the batch; NULL uses the
 * row index. Each call should use a new step (or new ids): the same seed,
 * step and id give the same uniform.
 *
 * Logits may be -inf (a token that cannot be drawn); a NaN or +inf, or a row
 * of -inf only, is refused. A token whose probability underflows to 0 is
 * never drawn. The uniform has 48 bits and probabilities are summed in
 * double, so a token of probability q is drawn with probability q to within
 * about 2^-48 + vocab · 2^-53.
 *
 * Returns FALSE with QKV_ERROR_INVALID_ARGUMENT naming the bad option
 * (temperature negative, NaN or infinite; top_k negative; top_p NaN or
 * outside (0, 1]), a vocab outside [1, 2^31), a negative n_rows, or the
 * first bad row and token; with QKV_ERROR_MEMORY when the vocab token ids
 * that top-k and top-p work on (4 · vocab bytes, allocated once per call,
 * only with either of them on) cannot be had. tokens_out is not written
 * then. Single-threaded.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_sample_logits(const QkvSampleOptions *options, const float *logits, gint n_rows,
                           gint64 vocab, guint64 step, const guint64 *row_ids, gint32 *tokens_out,
                           GError **error);

/**
 * QkvGenerateOptions:
 *
 * A generate options.
 */
typedef struct {
  /* How each token is chosen; temperature 0 is greedy generation. */
  QkvSampleOptions sample;
  /* Scores per row that the callback writes, in [1, 2^31). */
  gint64 vocab;
  /* A token id in [0, vocab) fed at step 0 before every prompt, or -1 for
   * none (each prompt then needs a token). */
  gint32 bos;
  /* A token id in [0, vocab) that ends a row when it is drawn, or -1 for
   * none (every row runs to max_new_tokens). */
  gint32 eos;
  gpointer reserved[4];
} QkvGenerateOptions;

/**
 * qkv_generate_options_default: (skip)
 *
 * The default sampling options (qkv_sample_options_default()), vocab 0
 * (set it), no bos and no eos (-1).
 *
 * Returns: the #QkvGenerateOptions
 */
QKV_API
QkvGenerateOptions qkv_generate_options_default(void);

/**
 * qkv_generate: (skip)
 * @options: a #QkvGenerateOptions
 * @batch: the batch
 * @prompt: (nullable): the prompt
 * @prompt_lens: the prompt lens
 * @max_new_tokens: the max new tokens
 * @step: (scope call) (closure user_data): a #QkvDecodeStepFunc
 * @user_data: (closure): data for the callback
 * @out_tokens: the out tokens
 * @out_lens: (out) (optional): where to store the out lens, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * Continue batch prompts. prompt holds the prompts one after another (row
 * b's prompt_lens[b] tokens follow row b - 1's). Each step calls step once
 * for all batch rows, each row its own parent: at step t row b feeds
 * position t of its context (<bos> if set, then its prompt) while t is
 * inside it, then the token it drew at step t - 1. From the step that feeds
 * the last token of its context on, row b draws its next token from its
 * logits (qkv_sample_logits()'s rule, with step the index of the token among
 * the ones the row generates and id b, so a row's tokens do not depend on
 * the other rows' prompts or stopping). A row stops when it draws eos, or
 * when it has drawn max_new_tokens tokens (eos included); a stopped row is
 * still in later calls, fed eos (its last token when there is no eos), and
 * its scores are ignored, as are those of rows that have not reached the
 * last token of their context. The loop ends when every row has stopped:
 * at most max(context length) + max_new_tokens - 1 steps, so a
 * QkvStepDecoder compiled for that max_len can run it (with
 * rows_per_sentence 1).
 *
 * Out: out_tokens (batch × max_new_tokens) gets each row's new tokens
 * without eos, followed by eos up to max_new_tokens (with no eos every row
 * fills it); out_lens (batch) their count, below max_new_tokens exactly when
 * the row ended with eos. Everything is allocated before the first step:
 * the scores (4 · batch · vocab bytes) and, with top-k or top-p on, 4 ·
 * vocab bytes.
 *
 * Returns FALSE with QKV_ERROR_INVALID_ARGUMENT, before any step, for a bad
 * option, batch < 1, max_new_tokens < 1, a negative prompt length (or 0
 * without bos), prompt NULL with a prompt length above 0, a prompt token
 * outside [0, vocab) or steps that would not fit a gint (each names what is
 * wrong); QKV_ERROR_INVALID_ARGUMENT naming the step and row when the
 * callback writes NaN or +inf, or -inf only, for a row that draws;
 * QKV_ERROR_MEMORY when the buffers cannot be had; or the callback's error
 * (QKV_ERROR_INVALID_ARGUMENT naming the step if it returned FALSE without
 * one). The outputs are partly written then.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_generate(const QkvGenerateOptions *options, gint batch, const gint32 *prompt,
                      const gint *prompt_lens, gint max_new_tokens, QkvDecodeStepFunc step,
                      gpointer user_data, gint32 *out_tokens, gint *out_lens, GError **error);

/**
 * QkvPlanDecoder:
 *
 * ---- generation through a cached plan --------------------------------------
 *
 * A QkvPlanDecoder answers QkvDecodeStepFunc for any model whose one-token
 * graph was built in cached mode (QkvBuilderCache, qkv-builders.h): the
 * plan's input "tokens", i32 (rows, 1), takes one token per row, its input
 * "positions", i32 (rows), that token's position (the cache's positions),
 * and its output 0 holds rows × vocab logits ((rows, 1, vocab) or (rows,
 * vocab)). The decoder binds both inputs to tensors of its own, feeds step
 * t at position t, moves the caches' rows to their parents for beam search
 * (qkv_plan_reorder_states()), and when the caches are full (step max_len
 * since the context started) restarts every row's context from its last
 * max_len / 2 tokens, fed again at positions 0 …: learned positions cannot
 * slide with the window, so from then on a sampler that recomputes the last
 * max_len tokens at every step sees another context. Up to there the
 * logits are a full recomputation's to within rounding.
 */
typedef struct _QkvPlanDecoder QkvPlanDecoder;

/**
 * qkv_plan_decoder_new: (skip)
 * @plan: a #QkvPlan
 * @rows: the rows
 * @max_len: the max len
 * @error: return location for a #GError, or %NULL
 *
 * A decoder for plan (borrowed: it must outlive the decoder; the decoder's
 * tensors stay bound to it, the plan holding references) with rows rows and
 * caches of max_len positions (the builder's QkvBuilderCache.max_len). A plan
 * takes one decoder at a time (the caches are its states). NULL with
 * QKV_ERROR_INVALID_ARGUMENT for rows or max_len below 1 or a plan that has a
 * decoder already, the plan's bind error for inputs that are not as above,
 * QKV_ERROR_MEMORY.
 *
 * Returns: (transfer full) (nullable): a new #QkvPlanDecoder, or %NULL with @error set
 */
QKV_API
QkvPlanDecoder *qkv_plan_decoder_new(QkvPlan *plan, gint rows, gint64 max_len, GError **error);
/**
 * qkv_plan_decoder_free:
 * @decoder: a #QkvPlanDecoder
 *
 * See qkv_plan_decoder_new().
 */
QKV_API
void qkv_plan_decoder_free(QkvPlanDecoder *decoder);
/**
 * qkv_plan_decoder_step:
 * @decoder: the decoder
 * @step: the step
 * @tokens: the tokens
 * @parents: (array length=n_rows) (nullable): the parents, @n_rows of them
 * @n_rows: the number of @parents
 * @logits: (out) (optional): where to store the logits, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * A QkvDecodeStepFunc with user_data the decoder: step 0 starts over (the
 * slots the rows filled before are not read again), any other step must be
 * the one after the previous call; 1 ≤ n_rows ≤ rows (the plan's rows past
 * n_rows run on the last row's token). parents may be NULL. logits gets
 * n_rows × vocab. QKV_ERROR_INVALID_ARGUMENT for a step out of order, bad
 * n_rows or a parent outside [0, n_rows); the plan's run errors.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_plan_decoder_step(gpointer decoder, gint step, const gint32 *tokens,
                               const gint32 *parents, gint n_rows, float *logits, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvStepDecoder, qkv_step_decoder_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(QkvPlanDecoder, qkv_plan_decoder_free)

G_END_DECLS
