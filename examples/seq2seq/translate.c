/* translate.c: decoding with qkv's step decoders and beam search. */
#include "translate.h"

#include <string.h>

void
translator_init(Translator *t, gint num_steps, gint max_sentences, gint beam, double alpha,
                gint threads)
{
  *t = (Translator){0};
  t->options = qkv_beam_options_default();
  t->options.beam_size = beam;
  t->options.length_penalty = alpha;
  t->options.max_len = num_steps;
  t->num_steps = num_steps;
  t->max_sentences = max_sentences;
  t->threads = threads;
  t->cross_layer = -1;
}

void
translator_clear(Translator *t)
{
  g_clear_pointer(&t->decoder, qkv_step_decoder_free);
}

static gboolean
ensure_decoder(Translator *t, const ModelConfig *cfg, QkvParams *params, GError **error)
{
  if (t->decoder != NULL)
    return TRUE;
  gint rows = t->max_sentences * t->options.beam_size;
  if (cfg->kind == MODEL_TRANSFORMER) {
    QkvTransformerConfig tc = {.src_vocab = cfg->src_vocab,
                               .tgt_vocab = cfg->tgt_vocab,
                               .num_hiddens = cfg->num_hiddens,
                               .ffn_hiddens = cfg->ffn_hiddens,
                               .num_heads = cfg->num_heads,
                               .num_layers = cfg->num_layers,
                               .tie_embeddings = cfg->tie_embeddings};
    t->decoder = qkv_step_decoder_new_transformer(params, &tc, rows, t->num_steps, t->num_steps,
                                                  t->threads, error);
  } else if (cfg->kind == MODEL_BAHDANAU) {
    QkvGruSeq2SeqConfig gc = {cfg->src_vocab,   cfg->tgt_vocab,  cfg->embed_size,
                              cfg->num_hiddens, cfg->num_layers, 0.0};
    t->decoder = qkv_step_decoder_new_bahdanau(params, &gc, rows, t->num_steps, t->num_steps,
                                               t->threads, error);
  } else {
    QkvLuongConfig lc = {.src_vocab = cfg->src_vocab,
                         .tgt_vocab = cfg->tgt_vocab,
                         .embed_size = cfg->embed_size,
                         .num_hiddens = cfg->num_hiddens,
                         .num_layers = cfg->num_layers,
                         .attention = cfg->luong,
                         .input_feeding = cfg->input_feeding};
    t->decoder = qkv_step_decoder_new_luong(params, &lc, rows, t->num_steps, t->num_steps,
                                            t->threads, error);
  }
  /* decode as training's forward computed: bf16 products under --precision
   * bf16. options.c refuses an unknown --precision already; the try form
   * makes a value that slipped past it a message and a failed run, not a
   * critical. */
  if (t->decoder != NULL && !qkv_step_decoder_try_set_precision(t->decoder, cfg->precision, error))
    g_clear_pointer(&t->decoder, qkv_step_decoder_free);
  return t->decoder != NULL;
}

gboolean
translator_run(Translator *t, const ModelConfig *cfg, QkvParams *params, const Seq2SeqData *data,
               const gint32 *src, const gint32 *src_valid, gint n, gint32 *out, gint *lens,
               GError **error)
{
  if (!ensure_decoder(t, cfg, params, error))
    return FALSE;
  QkvShape ns = QKV_SHAPE(n, t->num_steps), n1 = QKV_SHAPE(n);
  g_autoptr(QkvTensor) s = qkv_tensor_new_i32(&ns, src);
  g_autoptr(QkvTensor) v = qkv_tensor_new_i32(&n1, src_valid);
  QkvBeamOptions o = t->options;
  o.vocab = vocab_size(data->tgt_vocab);
  o.bos = data->tgt_vocab->bos;
  o.eos = data->tgt_vocab->eos;
  return qkv_step_decoder_translate(t->decoder, s, v, &o, out, lens, NULL, error);
}

/* Feed <bos> and the translation again, one step at a time, and keep row 0's
 * encoder-decoder attention weights of every step. */
static QkvTensor *
attention_along(Translator *t, const Seq2SeqData *data, const gint32 *src, gint32 src_valid,
                const gint32 *tokens, gint len, GError **error)
{
  const gint T = t->num_steps;
  QkvShape ns = QKV_SHAPE(1, T), n1 = QKV_SHAPE(1);
  g_autoptr(QkvTensor) s = qkv_tensor_new_i32(&ns, src);
  g_autoptr(QkvTensor) v = qkv_tensor_new_i32(&n1, &src_valid);
  if (!qkv_step_decoder_start(t->decoder, s, v, 1, error))
    return NULL;
  gint64 V = qkv_step_decoder_vocab(t->decoder);
  g_autofree float *logits = g_new(float, V);
  QkvTensor *weights = NULL;
  for (gint step = 0; step <= len && step < T; step++) {
    gint32 token = step == 0 ? data->tgt_vocab->bos : tokens[step - 1];
    if (!qkv_step_decoder_step(t->decoder, step, &token, NULL, 1, logits, error)) {
      qkv_tensor_free(weights);
      return NULL;
    }
    /* (rows, heads, 1, S) or (rows, 1, S): row 0 is heads × S floats */
    const QkvTensor *w = qkv_step_decoder_cross_weights(t->decoder, t->cross_layer);
    const QkvShape *ws = qkv_tensor_shape(w);
    gint64 heads = ws->rank == 4 ? ws->dims[1] : 1, S = ws->dims[ws->rank - 1];
    if (weights == NULL) {
      QkvShape full = ws->rank == 4 ? QKV_SHAPE(1, heads, T, S) : QKV_SHAPE(1, T, S);
      weights = qkv_tensor_new(QKV_F32, &full);
    }
    const float *row = qkv_tensor_const_data(w);
    float *dst = qkv_tensor_f32(weights);
    for (gint64 h = 0; h < heads; h++)
      memcpy(dst + (h * T + step) * S, row + h * S, (gsize)S * sizeof(float));
  }
  return weights;
}

/* n tokens of ids joined by spaces */
static gchar *
tokens_text(const Vocab *vocab, const gint32 *ids, gint n)
{
  GString *text = g_string_new(NULL);
  for (gint i = 0; i < n; i++)
    g_string_append_printf(text, "%s%s", i ? " " : "", vocab_token(vocab, ids[i]));
  return g_string_free(text, FALSE);
}

gchar *
translator_sentence(Translator *t, const ModelConfig *cfg, QkvParams *params,
                    const Seq2SeqData *data, const gchar *sentence, QkvTensor **weights_out,
                    gchar *tokens_out[2], gint *src_len, gint *out_len, GError **error)
{
  const gint T = t->num_steps;
  g_autofree gint32 *src = g_new(gint32, T);
  g_autofree gint32 *out = g_new(gint32, T);
  gint32 valid = seq2seq_encode_sentence(data->src_vocab, sentence, T, src);
  gint len = 0;
  if (!translator_run(t, cfg, params, data, src, &valid, 1, out, &len, error))
    return NULL;
  if (weights_out != NULL &&
      (*weights_out = attention_along(t, data, src, valid, out, len, error)) == NULL)
    return NULL;
  *src_len = valid;
  *out_len = len;
  if (tokens_out != NULL && data->subwords != NULL) {
    tokens_out[0] = tokens_text(data->src_vocab, src, MAX(valid - 1, 0)); /* without <eos> */
    tokens_out[1] = tokens_text(data->tgt_vocab, out, len);
  }
  return seq2seq_decode_ids(data->tgt_vocab, out, len);
}
