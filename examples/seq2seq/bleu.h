/* bleu.h: the book's per-sentence BLEU. Corpus BLEU-4 as sacrebleu computes
 * it is the library's (qkv-bleu.h). */
#pragma once

#include <glib.h>

/* The book's bleu(pred, label, k) (d2l 0.17, section 9.7): the brevity
 * penalty exp(min(0, 1 − len_label / len_pred)) times Π_n p_n^(1/2^n) over
 * n = 1..k, on space-separated tokens. 0 to 1. */
double bleu(const gchar *pred, const gchar *label, gint k);
