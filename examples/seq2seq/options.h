/* options.h: qkv-seq2seq's command line, parsed into one struct that the
 * program passes around. */
#pragma once

#include <glib.h>

#include "luong-options.h"
#include "model.h"

/* Sentences --heatmap-sentence may draw in one picture. */
#define SEQ2SEQ_MAX_HEATMAPS 8

typedef struct {
  gchar *model; /* --model as given, or NULL */
  gchar *task;
  gchar *data;
  gint epochs; /* the model's default unless given */
  gint num_examples;
  gint batch;
  gint steps;
  double lr;
  double dropout;
  gint hidden;
  gint layers;
  gint heads;
  gint ffn;
  double clip;
  gint threads; /* 0: the library's default */
  gint64 seed;
  gchar *save;
  gchar *resume;
  gchar **translate;
  gchar *heatmap;
  gint reverse_vocab;
  gint reverse_size;
  gboolean quiet;
  gint beam;
  double length_penalty;
  gboolean tie;
  gboolean distributed;
  gint save_every;
  gchar *step_losses;
  gint accumulate;
  double label_smoothing;
  gint warmup;
  gchar *clip_rule;
  gint heldout;
  LuongOptions luong;
  /* watching a run, validation and one's own data (their part of options.c) */
  gchar *log;                              /* --log FILE.jsonl */
  gchar *plot;                             /* --plot FILE.png */
  gint valid;                              /* --valid N: pairs held out for validation; 0: none */
  gchar *valid_data;                       /* --valid-data FILE */
  gint valid_every;                        /* --valid-every K epochs */
  gchar *save_best;                        /* --save-best FILE */
  gint early_stop;                         /* --early-stop P evaluations; 0: never */
  gchar *test_data;                        /* --test-data FILE for the held-out BLEU */
  gint min_freq;                           /* --min-freq: rarer words are <unk> */
  gchar *vocab_name;                       /* --vocab word|sentencepiece as given, or NULL */
  gboolean subwords;                       /* --vocab sentencepiece */
  gint spm_vocab_size;                     /* --spm-vocab-size: pieces of a trained model */
  gchar *spm_type;                         /* --spm-type unigram|bpe, or NULL (unigram) */
  gchar *spm_model;                        /* --spm-model FILE: load instead of training */
  gchar *spm_save;                         /* --spm-save FILE: where a trained model goes */
  gint max_len;                            /* --max-len: longer pairs are skipped; 0: no limit */
  gchar *heatmap_sentence;                 /* --heatmap-sentence N[,N...] as given */
  gint heatmap_rows[SEQ2SEQ_MAX_HEATMAPS]; /* which sentences, from 1 */
  gint n_heatmap_rows;
  gint heatmap_block; /* --heatmap-block B, from 1; 0: the last */
  gboolean version;
  gboolean translate_stdin; /* --translate -: a filter from stdin to stdout */
  /* what --task and --model chose */
  gchar *precision_name;  /* --precision as given, or NULL */
  gchar *save_dtype_name; /* --save-dtype as given, or NULL */
  /* what --task, --model and --precision chose */
  gboolean reverse;
  ModelKind kind;
  QkvPrecision precision;
  QkvCheckpointDType save_dtype; /* of --save, --save-every and --save-best */
} Seq2seqOptions;

/* The defaults, as --help states them. */
void seq2seq_options_init(Seq2seqOptions *o);
/* Parse the command line (--help prints and exits here), check every value
 * against its range and the options against each other, and work out the
 * defaults that depend on others. A failure is a usage error. */
gboolean seq2seq_options_parse(Seq2seqOptions *o, gint *argc, gchar ***argv, GError **error);
/* Whether validation is on (--valid or --valid-data). */
gboolean seq2seq_options_validating(const Seq2seqOptions *o);
/* Whether --save and --heatmap can be written (before training: a path
 * that cannot be written must not lose the model after it). */
gboolean seq2seq_options_check_paths(const Seq2seqOptions *o, GError **error);
void seq2seq_options_clear(Seq2seqOptions *o);
