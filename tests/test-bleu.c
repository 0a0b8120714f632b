/* test-bleu.c: the library's BLEU (qkv-bleu.h) against sacrebleu.
 *
 * sacrebleu is not a dependency, so its numbers come from two places that
 * can be checked by reading: the example in sacrebleu's README (a corpus of
 * three sentences with two references each, whose score line it prints),
 * and small cases whose n-grams are counted by hand in the comments, with
 * sacrebleu's definition (compute_bleu, smooth_method "exp"). The 13a
 * tokenisations follow from the four rules of sacrebleu's TokenizerRegexp,
 * applied one after another over the whole line; they were also checked
 * with Python's re module on those patterns. */
#include <math.h>
#include <qkv/qkv.h>

static void
assert_close(double got, double want)
{
  if (fabs(got - want) > 1e-9 * MAX(1.0, fabs(want)))
    g_error("got %.15g, want %.15g", got, want);
}

static void
test_tokenize_13a(void)
{
  const struct {
    const gchar *in, *out;
  } cases[] = {
      /* ! gets spaces (rule 1); the comma follows a letter (rule 2) */
      {"Hello, world!", "Hello , world !"},
      /* $ is a symbol (rule 1); 3.50 and 3,000 keep their separators, which
       * sit between digits; the comma after 50 is followed by a space and
       * the final period follows a letter */
      {"It costs $3.50, or 3,000 yen.", "It costs $ 3.50 , or 3,000 yen ."},
      /* a dash is split off only after a digit (rule 4): 1990-2000 and the
       * first dash of 10--12 */
      {"well-known 1990-2000 -5 pages 10--12", "well-known 1990 - 2000 -5 pages 10 - -12"},
      /* every period after a letter is split; 3.14 keeps its period, the
       * dots after it do not (the first follows a digit but is followed by a
       * period, rule 3) */
      {"U.S.A. e.g. 3.14... the end.", "U . S . A . e . g . 3.14 . . . the end ."},
      /* a period before a digit after a space (rule 2), after a digit before
       * a space (rule 3), between digits (kept) */
      {".5 and 5. and 1.2.3 and a,b and 1,b", ". 5 and 5 . and 1.2.3 and a , b and 1 , b"},
      /* entities, in sacrebleu's order: &amp;quot; becomes &quot;, which
       * stays (it was replaced before &amp;), and is then split */
      {"&quot;Yes&quot; &amp; no &lt;b&gt; &amp;quot;", "\" Yes \" & no < b > & quot ;"},
      /* <skipped> removed, a dash at a line end joins the lines, other
       * newlines are spaces */
      {"<skipped>hyphen-\nated\nline", "hyphenated line"},
      /* brackets, slash, + = % # @ ~ ^ _ ` split; the apostrophe is not */
      {"(a) [b] {c} a/b x+y=z 50% #1 @home ~ ^_^ `q` it's",
       "( a ) [ b ] { c } a / b x + y = z 50 % # 1 @ home ~ ^ _ ^ ` q ` it's"},
      /* non-ASCII punctuation is left alone; ':' is split; in "1.-2." the
       * period follows a digit but precedes '-' (rule 3) */
      {"Don't\u2014stop\u2014now: \u00abok\u00bb 1.-2.",
       "Don't\u2014stop\u2014now : \u00abok\u00bb 1 . -2 ."},
      {"", ""},
      {"   \t  ", ""},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree gchar *got = qkv_bleu_tokenize_13a(cases[i].in);
    g_assert_cmpstr(got, ==, cases[i].out);
  }
}

static void
test_split(void)
{
  /* Python's str.split(): U+00A0, U+2009, U+3000, U+0085 and U+001F
   * separate; U+200B (zero width, a format character) does not */
  g_auto(GStrv) words = qkv_bleu_split(" a\u00a0b\u2009c\u3000d\xc2\x85"
                                       "e\x1f"
                                       "f\u200bg \t\n");
  const gchar *want[] = {"a", "b", "c", "d", "e", "f\u200bg", NULL};
  g_assert_cmpstrv(words, want);
  g_auto(GStrv) none = qkv_bleu_split("  ");
  g_assert_cmpuint(g_strv_length(none), ==, 0);
}

/* sacrebleu's README: BLEU(...).corpus_score(sys, refs) prints
 * "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17
 * ref_len = 18)". By hand (13a splits off each final period):
 *   "The dog bit the man ." equals its first reference: 6/5/4/3 of 6/5/4/3;
 *   "It wasn't surprising ." matches It and . only: 2/0/0/0 of 4/3/2/1,
 *     both references 5 tokens long;
 *   "The man had just bitten him ." 6/2/1/0 of 7/6/5/4 (had and "man had"
 *     from the second reference, "The man had" too), the second reference's
 *     7 tokens the closest.
 * Sums: 14/7/5/3 of 17/14/11/8, 17 tokens against 5 + 6 + 7 = 18. */
static void
test_sacrebleu_readme(void)
{
  const gchar *sys[] = {"The dog bit the man.", "It wasn't surprising.",
                        "The man had just bitten him."};
  const gchar *refs[3][2] = {{"The dog bit the man.", "The dog had bit the man."},
                             {"It was not unexpected.", "No one was surprised."},
                             {"The man bit him first.", "The man had bitten the dog."}};
  QkvBleuStats stats = {0};
  for (guint i = 0; i < 3; i++)
    qkv_bleu_stats_add_text_multi(&stats, sys[i], refs[i], 2, NULL);
  const gint64 correct[] = {14, 7, 5, 3}, total[] = {17, 14, 11, 8};
  for (gint n = 0; n < 4; n++) {
    g_assert_cmpint(stats.correct[n], ==, correct[n]);
    g_assert_cmpint(stats.total[n], ==, total[n]);
  }
  g_assert_cmpint(stats.sys_len, ==, 17);
  g_assert_cmpint(stats.ref_len, ==, 18);
  double want = 100.0 * exp(1.0 - 18.0 / 17.0) *
                pow(14.0 / 17 * 7.0 / 14 * 5.0 / 11 * 3.0 / 8, 0.25); /* 48.5308... */
  assert_close(qkv_bleu_stats_score(&stats, FALSE), want);
  g_autofree gchar *line = qkv_bleu_stats_format(&stats, FALSE);
  g_assert_cmpstr(line, ==,
                  "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 "
                  "ref_len = 18)");
}

/* Small cases counted by hand through qkv_bleu_corpus (one reference). */
static void
test_hand_counted(void)
{
  QkvBleuOptions o = qkv_bleu_options_default();
  QkvBleuStats stats;
  /* "The cat sat on the mat ." against "The cat sat on a mat !": The cat sat
   * on mat (5/7; "the" is not "The"), "The cat" "cat sat" "sat on" (3/6),
   * "The cat sat" "cat sat on" (2/5), "The cat sat on" (1/4); 7 tokens each */
  const gchar *h1[] = {"The cat sat on the mat."}, *r1[] = {"The cat sat on a mat!"};
  double got = qkv_bleu_corpus(h1, r1, 1, &o, &stats);
  assert_close(got, 100.0 * pow(5.0 / 7 * 3.0 / 6 * 2.0 / 5 * 1.0 / 4, 0.25)); /* 43.47 */

  /* "Hello , World !" against "hello , world !": only , and ! match (2/4);
   * no 2-, 3- or 4-gram does, so "exp" smoothing gives them 100 / (2·3),
   * 100 / (4·2) and 100 / (8·1) per cent. Lower-cased, all match. */
  const gchar *h2[] = {"Hello, World!"}, *r2[] = {"hello, world!"};
  got = qkv_bleu_corpus(h2, r2, 1, &o, NULL);
  assert_close(got, pow(50.0 * (100.0 / 6) * (100.0 / 8) * (100.0 / 8), 0.25)); /* 19.00 */
  o.lowercase = TRUE;
  assert_close(qkv_bleu_corpus(h2, r2, 1, &o, NULL), 100.0);
  o.lowercase = FALSE;

  /* 13a: "It costs $ 3.50 , or 3,000 yen ." (9) against the same without
   * the comma (8): 8/9, then 6/8 (the two bigrams around ',' miss), 4/7
   * ("It costs $", "costs $ 3.50", "or 3,000 yen", "3,000 yen ."), 2/6
   * ("It costs $ 3.50", "or 3,000 yen ."); longer than the reference */
  const gchar *h3[] = {"It costs $3.50, or 3,000 yen."}, *r3[] = {"It costs $3.50 or 3,000 yen."};
  got = qkv_bleu_corpus(h3, r3, 1, &o, &stats);
  assert_close(got, 100.0 * pow(8.0 / 9 * 6.0 / 8 * 4.0 / 7 * 2.0 / 6, 0.25)); /* 59.69 */
  g_assert_cmpint(stats.sys_len, ==, 9);
  g_assert_cmpint(stats.ref_len, ==, 8);
  /* tok:none: "$3.50," and "yen." stay words: It costs or 3,000 yen. (5/6),
   * "It costs" "or 3,000" "3,000 yen." (3/5), "or 3,000 yen." (1/4), no
   * 4-gram: 100 / (2·3) */
  o.tokenize = QKV_BLEU_TOKENIZE_NONE;
  got = qkv_bleu_corpus(h3, r3, 1, &o, NULL);
  assert_close(got, pow((500.0 / 6) * 60.0 * 25.0 * (100.0 / 6), 0.25)); /* 37.99 */
}

/* Corpus statistics are sums, not averages of sentence scores; tokens
 * (tok:none) split on any run of white space. */
static void
test_corpus_sums(void)
{
  QkvBleuOptions none = {.tokenize = QKV_BLEU_TOKENIZE_NONE};
  QkvBleuStats same = {0};
  qkv_bleu_stats_add_text(&same, "il est calme .", "il est calme .", &none);
  assert_close(qkv_bleu_stats_score(&same, FALSE), 100.0);

  /* 1- to 4-grams match 4/5, 3/4, 2/3, 1/2; lengths 5 against 6 */
  QkvBleuStats short_hyp = {0};
  qkv_bleu_stats_add_text(&short_hyp, "a b c d e", "a b c d f g", &none);
  double want = 100.0 * exp(1.0 - 6.0 / 5.0) * pow(4.0 / 5 * 3.0 / 4 * 2.0 / 3 * 1.0 / 2, 0.25);
  assert_close(qkv_bleu_stats_score(&short_hyp, FALSE), want);

  /* no 3- or 4-gram matches: 1/(2·2) and 1/(4·1); 3/4 and 1/3 below */
  QkvBleuStats smoothed = {0};
  qkv_bleu_stats_add_text(&smoothed, "a b x d", "a b c d", &none);
  assert_close(qkv_bleu_stats_score(&smoothed, FALSE),
               100.0 * pow(3.0 / 4 * 1.0 / 3 * 1.0 / 4 * 1.0 / 4, 0.25));

  /* both together: 7/9, 4/7, 2/5, 1/3 over lengths 9 against 10 */
  QkvBleuStats corpus = {0};
  qkv_bleu_stats_add_text(&corpus, "a b c d e", "a b c d f g", &none);
  qkv_bleu_stats_add_text(&corpus, "a  b x d ", "a b c d\r\n", &none);
  want = 100.0 * exp(1.0 - 10.0 / 9.0) * pow(7.0 / 9 * 4.0 / 7 * 2.0 / 5 * 1.0 / 3, 0.25);
  assert_close(qkv_bleu_stats_score(&corpus, FALSE), want);

  /* clipping: "the" counts once; no 4-gram at all scores 0, and so does an
   * empty corpus or a hypothesis with nothing right */
  QkvBleuStats clipped = {0};
  qkv_bleu_stats_add_text(&clipped, "the the the", "the cat", &none);
  g_assert_cmpint(clipped.correct[0], ==, 1);
  g_assert_cmpint(clipped.total[0], ==, 3);
  g_assert_cmpfloat(qkv_bleu_stats_score(&clipped, FALSE), ==, 0.0);
  QkvBleuStats empty = {0};
  g_assert_cmpfloat(qkv_bleu_stats_score(&empty, FALSE), ==, 0.0);
  QkvBleuStats wrong = {0};
  qkv_bleu_stats_add_text(&wrong, "x y z w", "a b c d", &none);
  g_assert_cmpfloat(qkv_bleu_stats_score(&wrong, FALSE), ==, 0.0);
}

/* eff:yes averages only the orders some hypothesis reaches, as sacrebleu's
 * sentence_bleu: "a b" against itself has no 3- or 4-gram. */
static void
test_effective_order(void)
{
  QkvBleuOptions o = {.tokenize = QKV_BLEU_TOKENIZE_NONE, .effective_order = TRUE};
  const gchar *h[] = {"a b"}, *r[] = {"a b"};
  assert_close(qkv_bleu_corpus(h, r, 1, &o, NULL), 100.0);
  o.effective_order = FALSE;
  g_assert_cmpfloat(qkv_bleu_corpus(h, r, 1, &o, NULL), ==, 0.0);
  /* "a b c" against "a b d": 2/3, 1/2 and a 3-gram without a match
   * (100 / (2·1) per cent) over three orders */
  const gchar *h2[] = {"a b c"}, *r2[] = {"a b d"};
  o.effective_order = TRUE;
  assert_close(qkv_bleu_corpus(h2, r2, 1, &o, NULL), cbrt(200.0 / 3 * 50.0 * 50.0));
}

/* Token sequences are compared as whole strings: a token holding a space
 * is not two tokens. */
static void
test_tokens(void)
{
  const gchar *hyp[] = {"a b", "c", NULL}, *ref[] = {"a", "b", "c", NULL};
  QkvBleuStats stats = {0};
  qkv_bleu_stats_add_tokens(&stats, hyp, ref);
  g_assert_cmpint(stats.correct[0], ==, 1); /* c */
  g_assert_cmpint(stats.total[0], ==, 2);
  g_assert_cmpint(stats.correct[1], ==, 0);
  g_assert_cmpint(stats.sys_len, ==, 2);
  g_assert_cmpint(stats.ref_len, ==, 3);
  const gchar *const *hyps[] = {(const gchar *[]){"x", "y", "z", "w", NULL}};
  const gchar *const *refs[] = {(const gchar *[]){"x", "y", "z", "w", NULL}};
  assert_close(qkv_bleu_corpus_tokens(hyps, refs, 1, FALSE, NULL), 100.0);
}

static void
test_signature(void)
{
  g_autofree gchar *def = qkv_bleu_signature(NULL, 1);
  g_autofree gchar *want_def =
      g_strdup_printf("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:qkv-%s", qkv_version());
  g_assert_cmpstr(def, ==, want_def);
  QkvBleuOptions o = {.tokenize = QKV_BLEU_TOKENIZE_NONE, .lowercase = TRUE};
  g_autofree gchar *lc = qkv_bleu_signature(&o, 2);
  g_assert_true(g_str_has_prefix(lc, "nrefs:2|case:lc|eff:no|tok:none|smooth:exp|version:qkv-"));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/bleu/tokenize-13a", test_tokenize_13a);
  g_test_add_func("/bleu/split", test_split);
  g_test_add_func("/bleu/sacrebleu-readme", test_sacrebleu_readme);
  g_test_add_func("/bleu/hand-counted", test_hand_counted);
  g_test_add_func("/bleu/corpus-sums", test_corpus_sums);
  g_test_add_func("/bleu/effective-order", test_effective_order);
  g_test_add_func("/bleu/tokens", test_tokens);
  g_test_add_func("/bleu/signature", test_signature);
  return g_test_run();
}
