/* resume.c: --save and --resume, checkpoints of a run with the metadata
 * that lets --resume refuse one of another model or data (trainer.h). */
#include <math.h>
#include <qkv/qkv-checkpoint.h>

#include "../common/spm.h"
#include "trainer.h"

gboolean
trainer_save(Trainer *tr, const gchar *path, GError **error)
{
  g_autoptr(GHashTable) meta = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
  g_hash_table_insert(meta, "seq2seq.model", g_strdup(model_kind_name(tr->cfg.kind)));
  if (tr->cfg.kind == MODEL_LUONG) /* the same parameters serve several attentions */
    g_hash_table_insert(meta, "seq2seq.attention", model_attention_describe(&tr->cfg));
  g_hash_table_insert(meta, "seq2seq.epochs_done", g_strdup_printf("%d", tr->epochs_done));
  g_hash_table_insert(meta, "seq2seq.global_step",
                      g_strdup_printf("%" G_GINT64_FORMAT, tr->global_step));
  /* the options that shape the model but not its parameters' shapes (heads)
   * or that the data depends on, so that --resume can refuse a mismatch */
  g_hash_table_insert(meta, "seq2seq.hidden", g_strdup_printf("%d", tr->opt->hidden));
  g_hash_table_insert(meta, "seq2seq.layers", g_strdup_printf("%d", tr->opt->layers));
  g_hash_table_insert(meta, "seq2seq.heads", g_strdup_printf("%d", tr->opt->heads));
  g_hash_table_insert(meta, "seq2seq.ffn", g_strdup_printf("%d", tr->opt->ffn));
  g_hash_table_insert(meta, "seq2seq.num_steps", g_strdup_printf("%d", tr->opt->steps));
  g_hash_table_insert(meta, "seq2seq.src_vocab", vocab_join(tr->data.src_vocab));
  g_hash_table_insert(meta, "seq2seq.tgt_vocab", vocab_join(tr->data.tgt_vocab));
  g_hash_table_insert(meta, "seq2seq.vocab",
                      g_strdup(tr->data.subwords != NULL ? "sentencepiece" : "word"));
  if (tr->data.subwords != NULL) {
    /* the model itself, so that --resume and --translate need no other
     * file (the piece list above cannot split a sentence) */
    g_autoptr(GBytes) model = spm_serialize(tr->data.subwords);
    gsize len = 0;
    const guchar *bytes = g_bytes_get_data(model, &len);
    g_hash_table_insert(meta, "seq2seq.spm_model", g_base64_encode(bytes, len));
  }
  return qkv_checkpoint_save_full(path, tr->params, tr->optimizer, NULL, meta, tr->opt->save_dtype,
                                  error);
}

/* An integer of the checkpoint's metadata, parsed in full and in range. */
static gboolean
meta_int(GHashTable *meta, const gchar *path, const gchar *key, gint64 min, gint64 max, gint64 *out,
         GError **error)
{
  const gchar *text = g_hash_table_lookup(meta, key);
  if (text == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s has no %s in its metadata (not written by this qkv-seq2seq's --save)", path,
                key);
    return FALSE;
  }
  if (!g_ascii_string_to_signed(text, 10, min, max, out, NULL)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: metadata %s is '%s', not an integer from %" G_GINT64_FORMAT
                " to %" G_GINT64_FORMAT,
                path, key, text, min, max);
    return FALSE;
  }
  return TRUE;
}

static gboolean
tensor_is_finite(QkvTensor *t)
{
  if (qkv_tensor_dtype(t) != QKV_F32)
    return TRUE;
  const float *x = qkv_tensor_f32(t);
  for (gint64 i = 0, n = qkv_tensor_numel(t); i < n; i++)
    if (!isfinite(x[i]))
      return FALSE;
  return TRUE;
}

/* Which vocabulary a checkpoint's metadata says; checkpoints from before
 * --vocab have words. */
static const gchar *
meta_vocab(GHashTable *meta)
{
  const gchar *kind = g_hash_table_lookup(meta, "seq2seq.vocab");
  return kind != NULL ? kind : "word";
}

Spm *
trainer_checkpoint_subwords(const gchar *path, GError **error)
{
  g_autoptr(GHashTable) meta = qkv_checkpoint_read_metadata(path, error);
  if (meta == NULL)
    return NULL;
  const gchar *text = g_hash_table_lookup(meta, "seq2seq.spm_model");
  if (!g_str_equal(meta_vocab(meta), "sentencepiece") || text == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s was trained with --vocab %s and holds no SentencePiece model (leave out "
                "--vocab sentencepiece, or give --spm-model)",
                path, meta_vocab(meta));
    return NULL;
  }
  gsize len = 0;
  g_autofree guchar *bytes = g_base64_decode(text, &len);
  Spm *spm = spm_load_serialized(bytes, len, error);
  if (spm == NULL)
    g_prefix_error(error, "%s: its seq2seq.spm_model: ", path);
  return spm;
}

gboolean
trainer_resume(Trainer *tr, const gchar *path, GError **error)
{
  g_autoptr(GHashTable) meta = qkv_checkpoint_read_metadata(path, error);
  if (meta == NULL)
    return FALSE;
  const gchar *model = g_hash_table_lookup(meta, "seq2seq.model");
  const gchar *want = model_kind_name(tr->cfg.kind);
  if (model == NULL || !g_str_equal(model, want)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s holds a '%s' model, not '%s' (use --model)", path, model ? model : "?", want);
    return FALSE;
  }
  g_autofree gchar *attention = model_attention_describe(&tr->cfg);
  const gchar *stored_attention = g_hash_table_lookup(meta, "seq2seq.attention");
  if (attention != NULL &&
      (stored_attention == NULL || !g_str_equal(stored_attention, attention))) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s was trained with Luong attention '%s', not '%s' (use --score, --local-m, "
                "--local-p, --input-feeding)",
                path, stored_attention ? stored_attention : "?", attention);
    return FALSE;
  }
  /* The number of heads does not show in the parameters' shapes, so a
   * strict load alone would take a 2-head model as a 4-head one. */
  struct {
    const gchar *key, *option;
    gint value;
    gboolean applies;
  } config[] = {
      {"seq2seq.hidden", "--hidden", tr->opt->hidden, TRUE},
      {"seq2seq.layers", "--layers", tr->opt->layers, TRUE},
      {"seq2seq.heads", "--heads", tr->opt->heads, tr->cfg.kind == MODEL_TRANSFORMER},
      {"seq2seq.ffn", "--ffn", tr->opt->ffn, tr->cfg.kind == MODEL_TRANSFORMER},
      {"seq2seq.num_steps", "--num-steps", tr->opt->steps, TRUE},
  };
  for (guint i = 0; i < G_N_ELEMENTS(config); i++) {
    gint64 stored;
    if (!config[i].applies)
      continue;
    if (!meta_int(meta, path, config[i].key, 1, G_MAXINT, &stored, error))
      return FALSE;
    if (stored != config[i].value) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "%s was trained with %s %" G_GINT64_FORMAT
                  ", not %s %d (give %s %" G_GINT64_FORMAT ")",
                  path, config[i].option, stored, config[i].option, config[i].value,
                  config[i].option, stored);
      return FALSE;
    }
  }
  gint64 done, step;
  if (!meta_int(meta, path, "seq2seq.epochs_done", 0, 1000000, &done, error) ||
      !meta_int(meta, path, "seq2seq.global_step", 0, G_MAXINT64, &step, error))
    return FALSE;
  const gchar *vocab = tr->data.subwords != NULL ? "sentencepiece" : "word";
  if (!g_str_equal(meta_vocab(meta), vocab)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s was trained with --vocab %s, not --vocab %s (give --vocab %s)", path,
                meta_vocab(meta), vocab, meta_vocab(meta));
    return FALSE;
  }
  g_autofree gchar *sv = vocab_join(tr->data.src_vocab);
  g_autofree gchar *tv = vocab_join(tr->data.tgt_vocab);
  const gchar *fsv = g_hash_table_lookup(meta, "seq2seq.src_vocab");
  const gchar *ftv = g_hash_table_lookup(meta, "seq2seq.tgt_vocab");
  if (fsv == NULL || ftv == NULL || !g_str_equal(fsv, sv) || !g_str_equal(ftv, tv)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s was trained on other data (its vocabularies differ; check --task and "
                "--num-examples)",
                path);
    return FALSE;
  }
  if (!qkv_checkpoint_load(path, tr->params, tr->optimizer, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL,
                           error))
    return FALSE;
  /* NaN or Inf weights would train to a NaN loss and translate to noise */
  for (guint i = 0; i < qkv_params_size(tr->params); i++) {
    QkvParam *param = qkv_params_nth(tr->params, i);
    const gchar *bad = tensor_is_finite(qkv_param_value(param)) ? NULL : "value";
    for (guint j = 0; bad == NULL && j < qkv_param_n_states(param); j++) {
      QkvTensor *state = NULL;
      const gchar *name = qkv_param_nth_state(param, j, &state);
      if (!tensor_is_finite(state))
        bad = name;
    }
    if (bad != NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "%s: %s of parameter %s holds NaN or Inf", path,
                  g_str_equal(bad, "value") ? "the value" : bad, qkv_param_name(param));
      return FALSE;
    }
  }
  tr->epochs_done = (gint)done;
  tr->global_step = step;
  return TRUE;
}
