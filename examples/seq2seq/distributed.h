/* distributed.h: qkv-seq2seq --distributed, data-parallel training over MPI
 * with qkv-dist.h. Without --distributed every function acts as the single
 * process it is (rank 0 of 1). */
#pragma once

#include <qkv/qkv.h>
#include <qkv/qkv-optim.h>

#include "data.h"
#include "model.h"
#include "options.h"

/* Join the MPI job; the global batch (the whole of --batch-size, or the data
 * if smaller) must give every rank at least one example, and the ranks must
 * agree on every option that shapes training, on the model's configuration,
 * the vocabularies and the training data (a hash); they differ only in
 * their shard of each batch, their --threads, and what only rank 0 does
 * (--save, --save-every, --step-losses, the evaluation after training).
 * Ranks other than 0 print nothing on stdout from here on. */
gboolean seq2seq_dist_start(const Seq2seqOptions *o, const ModelConfig *cfg,
                            const Seq2SeqData *data, GError **error);
/* --resume: every rank starts training at the same epoch and step. */
gboolean seq2seq_dist_agree_position(gint epochs_done, gint64 global_step, GError **error);
/* Training is over: leave the job's collectives together (before rank 0
 * evaluates, so that no rank waits on that). Fails when another rank is
 * still training. */
gboolean seq2seq_dist_leave_trained(gint epochs_done, gint64 global_step, GError **error);
/* Leave the job (finalizes MPI unless a collective failed). A rank stopped
 * by error tells the others why first, so that they stop too. */
void seq2seq_dist_finish(const GError *error);
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
 * alike, which rank 0 prints for all (the others say that it does). */
void seq2seq_dist_print_error(const gchar *program, const GError *error);

/* --step-losses FILE: one line per training step, "STEP LOSS" with the book's
 * loss metric of that step's (global) batch; written by rank 0 only. */
gboolean seq2seq_step_log_open(const gchar *path, GError **error);
void seq2seq_step_log(gint64 step, double loss);
void seq2seq_step_log_close(void);
