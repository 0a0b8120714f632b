/* bleu.h: the seq2seq example's translation scores — the book's
 * per-sentence BLEU and corpus BLEU-4 as sacrebleu computes it. */
#pragma once

#include <glib.h>

/* The book's bleu(pred, label, k) (d2l 0.17, section 9.7): the brevity
 * penalty exp(min(0, 1 − len_label / len_pred)) times Π_n p_n^(1/2^n) over
 * n = 1..k, on space-separated tokens. 0 to 1. */
double bleu(const gchar *pred, const gchar *label, gint k);

#define BLEU_MAX_ORDER 4

/* The sufficient statistics of corpus BLEU, summed over sentences: clipped
 * n-gram matches and hypothesis n-grams per order, and the lengths. */
typedef struct {
  gint64 correct[BLEU_MAX_ORDER];
  gint64 total[BLEU_MAX_ORDER];
  gint64 sys_len, ref_len;
} BleuStats;

/* Add one hypothesis and its one reference, both tokenised text (tokens
 * separated by ASCII white space, as sacrebleu's tokenize="none" splits
 * them; Unicode spaces are not separators here). */
void bleu_stats_add(BleuStats *stats, const gchar *hypothesis, const gchar *reference);
/* Corpus BLEU-4 from the sums, 0 to 100, as sacrebleu's corpus_bleu with its
 * defaults (smooth_method "exp", no effective order): brevity penalty
 * exp(1 − ref_len / sys_len) when sys_len < ref_len, times the geometric
 * mean of the four n-gram precisions; an order with no match counts as
 * 1 / (2^j · total), j counting such orders; no match at all, or an order
 * with no n-gram, scores 0. */
double bleu_stats_score(const BleuStats *stats);
