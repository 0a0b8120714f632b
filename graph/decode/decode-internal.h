/* decode-internal.h: the step decoder's state and the helpers its model
 * files share (decode.c: the Transformer, Bahdanau and running;
 * decode-luong.c: Luong; decode-sizes.c: the checks of sizes and configs).
 * Not installed; G_GNUC_INTERNAL. */
#pragma once

#include <qkv/qkv.h>
#include <qkv/qkv-decode.h>

struct _QkvStepDecoder {
  gboolean transformer;
  gboolean luong;
  QkvTransformerConfig tc;
  /* Bahdanau's, and for Luong the GRU encoder's and decoder's sizes */
  QkvGruSeq2SeqConfig gc;
  QkvLuongConfig lc;
  gint max_rows, max_len, num_layers;
  gint64 src_len, vocab;
  gint rows;      /* rows in use since start(); 0 before */
  gint next_step; /* the step the next call must be */
  gboolean stepped;
  /* 1 while a thread runs start, step or translate (taken with a
   * compare-and-swap: a second thread is refused, QKV_ERROR_BUSY) */
  gint busy;

  QkvGraph *enc_graph;
  QkvPlan *enc_plan;
  QkvTensor *src, *src_valid; /* (max_rows, src_len), (max_rows) */

  QkvGraph *step_graph;
  QkvPlan *step_plan;
  QkvTensor *tokens;     /* (max_rows, 1) */
  QkvTensor *row_valid;  /* (max_rows): src_valid repeated per row */
  QkvTensor *positions;  /* Transformer: (max_rows), the step */
  QkvTensor *target_pos; /* Luong local-m: f32 (max_rows, 1, 1), the step */
  /* Transformer: no self (the step plan keeps its caches as graph states),
   * cross the encoder-decoder keys and values per block, k then v
   * (max_rows, heads, src_len, d_head).
   * Bahdanau and Luong: self[0] the GRU state (L, max_rows, H), cross[0]
   * the encoder outputs (max_rows, src_len, H); Luong with input feeding:
   * self[1] the last attentional vector (1, max_rows, H). */
  QkvTensor **self, **cross;
  gint n_self, n_cross;
  float *scratch; /* Bahdanau and Luong: one state, for moving rows to their parents */
};

/* decode-sizes.c: the sizes and config of a new decoder, checked before
 * anything is built: each size at least 1 and the config's fields
 * (QKV_ERROR_INVALID_ARGUMENT naming me), and the buffers they imply within
 * the address space, with overflow-safe arithmetic (QKV_ERROR_MEMORY naming
 * the sizes). */
G_GNUC_INTERNAL gboolean decode_check_transformer(const gchar *me,
                                                  const QkvTransformerConfig *config, gint max_rows,
                                                  gint64 src_len, gint max_len, GError **error);
G_GNUC_INTERNAL gboolean decode_check_gru(const gchar *me, const QkvGruSeq2SeqConfig *config,
                                          gint max_rows, gint64 src_len, gint max_len,
                                          GError **error);

G_GNUC_INTERNAL QkvTensor *decode_new_tensor(QkvDType dtype, QkvShape shape, GError **error);
/* Compile outs (NULL if any is NULL: its builder set the error). */
G_GNUC_INTERNAL QkvPlan *decode_compile(QkvGraph *g, QkvValue *const *outs, guint n, gint n_threads,
                                        GError **error);
/* Bind t[i] to the input "<prefix><i>". */
G_GNUC_INTERNAL gboolean decode_bind_all(QkvPlan *plan, const gchar *prefix, QkvTensor **t, gint n,
                                         GError **error);
/* A decoder of the book's GRU sizes (config's dropout ignored) with every
 * size checked (QKV_ERROR_INVALID_ARGUMENT naming me), nothing built yet. */
G_GNUC_INTERNAL QkvStepDecoder *decode_new_gru(const gchar *me, const QkvGruSeq2SeqConfig *config,
                                               gint max_rows, gint64 src_len, gint max_len,
                                               GError **error);
/* Builds one of the two plans of d on b's graph. */
typedef gboolean (*DecodePlanFunc)(QkvStepDecoder *d, QkvBuilder *b, gint n_threads,
                                   GError **error);
/* The encoder and step plans, each on a new graph over params, which must
 * hold every parameter they use (else the ones created are removed and the
 * first is named, QKV_ERROR_NOT_FOUND), then src, src_valid, tokens and
 * row_valid of max_rows rows. */
G_GNUC_INTERNAL gboolean decode_build_plans(QkvStepDecoder *d, QkvParams *params, const gchar *me,
                                            DecodePlanFunc encoder, DecodePlanFunc step,
                                            gint n_threads, GError **error);
/* The book's GRU encoder (d->gc's sizes) as the encoder plan: outputs 0 the
 * encoder outputs (R, S, H), 1 the final state (L, R, H). */
G_GNUC_INTERNAL gboolean decode_gru_encoder_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads,
                                                 GError **error);
