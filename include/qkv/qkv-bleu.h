/* qkv-bleu.h: corpus BLEU as sacrebleu computes it.
 *
 * BLEU-4 (Papineni et al., 2002) with sacrebleu's defaults: clipped n-gram
 * matches of orders 1 to 4 summed over the corpus, their geometric mean with
 * the "exp" smoothing of mteval-v13a.pl for orders without a match, and the
 * brevity penalty. Scores are 0 to 100, as sacrebleu prints them.
 *
 * Two ways in:
 *  - token sequences (qkv_bleu_stats_add_tokens): the tokens as the caller
 *    has them, compared as whole strings;
 *  - detokenised text (qkv_bleu_stats_add_text): lower-cased on request,
 *    then tokenised as sacrebleu's "13a" tokenizer does (the default) or
 *    split on white space only ("none").
 * One reference per hypothesis, or several (the _multi forms): then an
 * n-gram matches as often as the reference that has it most, and the brevity
 * penalty takes the reference length closest to the hypothesis's (the
 * shorter of two as close). qkv_bleu_signature() names what was computed in
 * sacrebleu's format, so a score can be quoted with it.
 *
 *   QkvBleuOptions o = qkv_bleu_options_default();
 *   double bleu = qkv_bleu_corpus(hyps, refs, n, &o, NULL);
 *   g_autofree gchar *sig = qkv_bleu_signature(&o, 1);
 *   printf("BLEU %.2f (%s)\n", bleu, sig);
 */
#pragma once

#include "qkv-api.h"

#include <glib.h>

G_BEGIN_DECLS

/**
 * QKV_BLEU_MAX_ORDER:
 *
 * Bleu max order.
 */
#define QKV_BLEU_MAX_ORDER 4

/**
 * QkvBleuTokenize:
 * @QKV_BLEU_TOKENIZE_13A: sacrebleu's default: mteval-v13a's rules (tok:13a)
 * @QKV_BLEU_TOKENIZE_NONE: the text is tokenised already: split on white space only (tok:none)
 *
 * The bleu tokenize values.
 */
typedef enum {
  /* sacrebleu's default: mteval-v13a's rules (tok:13a) */
  QKV_BLEU_TOKENIZE_13A,
  /* the text is tokenised already: split on white space only (tok:none) */
  QKV_BLEU_TOKENIZE_NONE,
} QkvBleuTokenize;

/**
 * QkvBleuOptions:
 *
 * A bleu options.
 */
typedef struct {
  QkvBleuTokenize tokenize;
  /* lower-case hypothesis and reference before tokenising (case:lc) */
  gboolean lowercase;
  /* leave out the orders that no hypothesis reaches (eff:yes), as
   * sacrebleu's sentence_bleu does; corpus BLEU leaves it off */
  gboolean effective_order;
} QkvBleuOptions;

/**
 * qkv_bleu_options_default: (skip)
 *
 * sacrebleu's corpus_bleu defaults: 13a, case kept, no effective order.
 *
 * Returns: the #QkvBleuOptions
 */
QKV_API
QkvBleuOptions qkv_bleu_options_default(void);

/**
 * QkvBleuStats:
 *
 * The sufficient statistics of corpus BLEU, summed over sentences: clipped
 * n-gram matches and hypothesis n-grams per order, and the lengths in
 * tokens. Start from zeros ({0}); two corpora's stats add field by field.
 */
typedef struct {
  gint64 correct[QKV_BLEU_MAX_ORDER];
  gint64 total[QKV_BLEU_MAX_ORDER];
  gint64 sys_len, ref_len;
} QkvBleuStats;

/**
 * qkv_bleu_stats_add_tokens:
 * @stats: a #QkvBleuStats
 * @hypothesis: (array zero-terminated=1) (nullable): the hypothesis, %NULL-terminated
 * @reference: (array zero-terminated=1) (nullable): the reference, %NULL-terminated
 *
 * Add one hypothesis and its reference, each a NULL-terminated array of
 * tokens. Tokens are compared as whole strings (a token may hold spaces).
 */
QKV_API
void qkv_bleu_stats_add_tokens(QkvBleuStats *stats, const gchar *const *hypothesis,
                               const gchar *const *reference);
/**
 * qkv_bleu_stats_add_tokens_multi:
 * @stats: a #QkvBleuStats
 * @hypothesis: (array zero-terminated=1): the hypothesis, %NULL-terminated
 * @references: (array length=n_refs): the references, @n_refs of them
 * @n_refs: the number of @references
 *
 * The same against n_refs ≥ 1 references.
 */
QKV_API
void qkv_bleu_stats_add_tokens_multi(QkvBleuStats *stats, const gchar *const *hypothesis,
                                     const gchar *const *const *references, gsize n_refs);
/**
 * qkv_bleu_stats_add_text:
 * @stats: a #QkvBleuStats
 * @hypothesis: the hypothesis
 * @reference: the reference
 * @options: (nullable): a #QkvBleuOptions
 *
 * Add one hypothesis and its reference as text (UTF-8; invalid bytes are
 * replaced by U+FFFD): trailing white space removed, lower-cased when
 * options->lowercase, tokenised as options->tokenize says, then split on
 * white space as Python's str.split() splits (options NULL: the defaults).
 */
QKV_API
void qkv_bleu_stats_add_text(QkvBleuStats *stats, const gchar *hypothesis, const gchar *reference,
                             const QkvBleuOptions *options);
/**
 * qkv_bleu_stats_add_text_multi:
 * @stats: a #QkvBleuStats
 * @hypothesis: the hypothesis
 * @references: (array length=n_refs): the references, @n_refs of them
 * @n_refs: the number of @references
 * @options: (nullable): a #QkvBleuOptions
 *
 * The same against n_refs ≥ 1 references.
 */
QKV_API
void qkv_bleu_stats_add_text_multi(QkvBleuStats *stats, const gchar *hypothesis,
                                   const gchar *const *references, gsize n_refs,
                                   const QkvBleuOptions *options);

/**
 * QkvBleuScore:
 *
 * A score with the figures sacrebleu prints beside it.
 */
typedef struct {
  double score;                          /* 0 to 100 */
  double precisions[QKV_BLEU_MAX_ORDER]; /* per cent, smoothed where 0 */
  double brevity_penalty;
  double ratio; /* sys_len / ref_len, 0 when ref_len is 0 */
} QkvBleuScore;

/**
 * qkv_bleu_stats_compute: (skip)
 * @stats: a #QkvBleuStats
 * @effective_order: the effective order
 *
 * BLEU from the sums, as sacrebleu's compute_bleu with smooth_method "exp":
 * the brevity penalty exp(1 − ref_len / sys_len) when sys_len < ref_len (0
 * for no hypothesis tokens), times the geometric mean of the precisions.
 * An order with no match counts as 100 / (2^j · total), j counting such
 * orders. No match at all scores 0, and so does an order with no n-gram
 * unless effective_order (which then averages the orders before it).
 *
 * Returns: the #QkvBleuScore
 */
QKV_API
QkvBleuScore qkv_bleu_stats_compute(const QkvBleuStats *stats, gboolean effective_order);
/**
 * qkv_bleu_stats_score:
 * @stats: a #QkvBleuStats
 * @effective_order: the effective order
 *
 * qkv_bleu_stats_compute()'s score alone.
 *
 * Returns: the double
 */
QKV_API
double qkv_bleu_stats_score(const QkvBleuStats *stats, gboolean effective_order);
/**
 * qkv_bleu_stats_format:
 * @stats: a #QkvBleuStats
 * @effective_order: the effective order
 *
 * "BLEU = 4.57 30.1/7.2/2.1/0.9 (BP = 1.000 ratio = 1.030 hyp_len = 9
 * ref_len = 10)", as sacrebleu formats a score; free with g_free().
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_bleu_stats_format(const QkvBleuStats *stats, gboolean effective_order);

/**
 * qkv_bleu_corpus_tokens:
 * @hypotheses: (array zero-terminated=1): the hypotheses, %NULL-terminated
 * @references: (array length=n): the references, @n of them
 * @n: the number of @references
 * @effective_order: the effective order
 * @stats_out: (nullable): a #QkvBleuStats
 *
 * Corpus BLEU of n hypotheses against their references. The token form
 * takes NULL-terminated token arrays; the text form tokenises as
 * qkv_bleu_stats_add_text() (options NULL: the defaults). stats_out (may be
 * NULL) gets the sums.
 *
 * Returns: the double
 */
QKV_API
double qkv_bleu_corpus_tokens(const gchar *const *const *hypotheses,
                              const gchar *const *const *references, gsize n,
                              gboolean effective_order, QkvBleuStats *stats_out);
/**
 * qkv_bleu_corpus:
 * @hypotheses: (array zero-terminated=1): the hypotheses, %NULL-terminated
 * @references: (array length=n): the references, @n of them
 * @n: the number of @references
 * @options: (nullable): a #QkvBleuOptions
 * @stats_out: a #QkvBleuStats
 *
 * See qkv_bleu_corpus_tokens().
 *
 * Returns: the double
 */
QKV_API
double qkv_bleu_corpus(const gchar *const *hypotheses, const gchar *const *references, gsize n,
                       const QkvBleuOptions *options, QkvBleuStats *stats_out);

/**
 * qkv_bleu_tokenize_13a:
 * @line: the line
 *
 * sacrebleu's 13a tokenizer on one line: "<skipped>" and "-\n" removed,
 * other newlines to spaces, &quot; &amp; &lt; &gt; unescaped; then spaces
 * around the ASCII punctuation and symbols other than ' , - . (and around
 * spaces), around '.' and ',' unless between digits, and after a '-' that
 * follows a digit; runs of white space to one space, none at the ends.
 * Free with g_free().
 *
 * Returns: (transfer full): a new string; free with g_free()
 */
QKV_API
gchar *qkv_bleu_tokenize_13a(const gchar *line);
/**
 * qkv_bleu_split:
 * @text: the text
 *
 * The white-space separated words of text, as Python's str.split() with no
 * argument finds them (the separators are Python's: ASCII white space,
 * U+001C to U+001F, U+0085, and the Unicode spaces and line and paragraph
 * separators). Free with g_strfreev().
 *
 * Returns: (transfer container) (element-type utf8): the result
 */
QKV_API
gchar **qkv_bleu_split(const gchar *text);

/**
 * qkv_bleu_signature:
 * @options: (nullable): a #QkvBleuOptions
 * @n_refs: the n refs
 *
 * What was computed against n_refs references per hypothesis, in
 * sacrebleu's signature format:
 * "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:qkv-0.1.0"
 * (options NULL: the defaults). Free with g_free().
 *
 * Returns: (transfer full) (nullable): a new string; free with g_free()
 */
QKV_API
gchar *qkv_bleu_signature(const QkvBleuOptions *options, gsize n_refs);

G_END_DECLS
