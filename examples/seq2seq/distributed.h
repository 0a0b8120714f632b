/* distributed.h: qkv-seq2seq --distributed, data-parallel training over MPI
 * with qkv-dist.h. Without --distributed every function acts as the single
 * process it is (rank 0 of 1). */
#pragma once

#include <qkv/qkv.h>
#include <qkv/qkv-optim.h>

/* Join the MPI job; the global batch (the whole of --batch-size, or the data
 * if smaller) must give every rank at least one example. Ranks other than 0
 * print nothing on stdout from here on. */
gboolean seq2seq_dist_start(gint global_batch, GError **error);
/* Leave the job (finalizes MPI unless a collective failed). */
void seq2seq_dist_finish(void);
gboolean seq2seq_dist_active(void);
gboolean seq2seq_dist_is_root(void);
gint seq2seq_dist_rank(void);
gint seq2seq_dist_world_size(void);
/* Give this rank's training plan its own dropout stream: the ranks' rows are
 * different examples, and equal seeds would give them the same masks. */
void seq2seq_dist_reseed(QkvPlan *plan, guint64 seed);
/* Threads per rank when --threads is not given: the cores this process may
 * run on, shared among the ranks on this machine. */
gint seq2seq_dist_default_threads(void);
/* This rank's rows [*offset, *offset + *count) of a global batch. */
void seq2seq_dist_shard(gint batch, gint *offset, gint *count);
/* Rank 0's weights and optimizer state on every rank. */
gboolean seq2seq_dist_broadcast(QkvParams *params, QkvOptimizer *optimizer, GError **error);
/* Sum the gradients, *loss and *tokens over the ranks (the loss is a sum over
 * sequences, so the sum of the shards' gradients is the whole batch's). */
gboolean seq2seq_dist_reduce(QkvParams *params, double *loss, double *tokens, GError **error);
/* Print a failure: each rank its own, except a mismatch every rank found
 * alike, which rank 0 prints for all. */
void seq2seq_dist_print_error(const gchar *program, const GError *error);

/* --step-losses FILE: one line per training step, "STEP LOSS" with the book's
 * loss metric of that step's (global) batch; written by rank 0 only. */
gboolean seq2seq_step_log_open(const gchar *path, GError **error);
void seq2seq_step_log(gint64 step, double loss);
void seq2seq_step_log_close(void);
