/* qkv-checkpoint.h: checkpoints in the safetensors format.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *
 *   bytes 0..7     N, the header length, u64 little-endian
 *   bytes 8..8+N   a JSON object, padded with spaces so the data starts at a
 *                  multiple of 8:
 *                    { "__metadata__": { "key": "value", ... },
 *                      "NAME": { "dtype": "F32", "shape": [d0, d1, ...],
 *                                "data_offsets": [begin, end] }, ... }
 *   bytes 8+N..    the tensors' raw little-endian data, back to back;
 *                  offsets are relative to the start of this section
 *
 * What qkv writes:
 *
 *   - every parameter under its own name, F32 (or BF16 on request, see
 *     qkv_checkpoint_save_full()), in store order: the file is a state_dict
 *     that safetensors.torch.load_file() reads as is;
 *   - with an optimizer, every state tensor of every parameter as
 *     "__optim__.<param>.<state>" (e.g. "__optim__.fc.weight.exp_avg", F32,
 *     the param's shape; "__optim__.fc.weight.step", I32, shape []), so state
 *     names may not contain '.';
 *   - metadata (all values strings, as the format requires):
 *       "format": "pt", "qkv.version",
 *       with an optimizer: "qkv.optimizer.kind" (sgd|adam|adamw),
 *         "qkv.optimizer.step", and its hyper-parameters "qkv.optimizer.lr",
 *         ".weight_decay", ".momentum", ".dampening", ".nesterov", ".beta1",
 *         ".beta2", ".eps" (doubles written to round-trip exactly);
 *         if it has added parameter groups (qkv_optimizer_add_group()),
 *         "qkv.optimizer.groups" (their number N), for each G from 1 to N
 *         "qkv.optimizer.group.G.pattern" (only if it has one), ".filter"
 *         (true|false: whether it has a filter), ".lr_factor" and
 *         ".weight_decay", and "qkv.optimizer.group_of.<param>" = "G" for
 *         every param of the store in group G >= 1 (no key: group 0);
 *       with a schedule: "qkv.schedule.kind" (qkv_schedule_kind_name()),
 *         "qkv.schedule.position";
 *       plus any user metadata (keys starting with "qkv." are reserved).
 *   Gradients and frozen flags are not saved.
 *
 * Loading the values, optimizer state, step count, hyper-parameters, group
 * settings and schedule position of a checkpoint into a store, optimizer
 * (same kind, same groups) and schedule (same kind) makes training continue
 * bit for bit as if it had never stopped. (A plan with dropout also needs its step: qkv_plan_set_step().)
 *
 * Saving is atomic: qkv writes a temporary file ".NAME.tmp-XXXXXX" (NAME:
 * the target's file name; XXXXXX: six letters or digits) in the same
 * directory, holding an exclusive flock() on it, fsyncs it, renames it over
 * path and fsyncs the directory. On any failure (an unwritable directory, a
 * full disk) path keeps its previous content and the call returns a
 * QKV_ERROR_IO. A save that is killed leaves its temporary file; the next
 * successful save of the same path removes every such file that matches the
 * pattern exactly, is a regular file owned by the caller, is not locked (a
 * live writer holds the lock) and has not been modified for 60 seconds (a
 * writer between creating and locking it, or one that cannot lock). Names
 * (parameters, states, metadata) must be valid UTF-8, or the save is refused
 * (QKV_ERROR_INVALID_ARGUMENT) before anything is written.
 *
 * Loading checks the whole file before it touches anything: the header
 * length within the file, the header is one JSON object (UTF-8, only
 * whitespace after it, no key twice in any object, no escaped NUL "\u0000" in
 * any string, nesting at most 16 deep), known dtypes, shapes, sizes equal to
 * dtype × shape, and, as the reference implementation requires, tensors that
 * sorted by offset tile the data section exactly: the first starts at 0,
 * each starts where the previous ends, the last ends at the end of the file
 * (no gap, no overlap, no trailing bytes; no alignment beyond that, since qkv
 * copies bytes). Then every name and shape against the store, and optimizer
 * step counts: a per-param "step" must be 0 to G_MAXINT32. Any problem is a
 * GError (QKV_ERROR_CORRUPT for a malformed file, naming the tensor and the
 * byte offset; QKV_ERROR_SHAPE, QKV_ERROR_DTYPE, QKV_ERROR_NOT_FOUND for a
 * file that does not fit the model) and leaves store, optimizer and schedule
 * unchanged. Values are copied into the existing tensors, whose data
 * pointers plans hold. The loader reads the whole file into memory first.
 *
 * Dtypes: f32 tensors (parameter values, optimizer states) load from F32,
 * BF16, F16 or F64; integer ones (step counts) from I32 or I64 (whose value
 * must fit in i32). Every BF16 and F16 value, subnormals, signed zeros,
 * infinities and NaN payloads included, is an f32, and loads exactly; F64
 * values are rounded to the nearest f32 (ties to even; beyond the f32 range
 * to infinity), so F64 loads may round. The other dtypes of the format are a
 * QKV_ERROR_DTYPE.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-params.h"
#include "qkv-optim.h"

G_BEGIN_DECLS

/**
 * QkvCheckpointFlags:
 * @QKV_CHECKPOINT_STRICT: strict
 * @QKV_CHECKPOINT_ALLOW_MISSING: params of the store that the file lacks keep their values
 * @QKV_CHECKPOINT_ALLOW_UNEXPECTED: tensors of the file that the store lacks are ignored
 *
 * The checkpoint flags values.
 */
typedef enum {
  QKV_CHECKPOINT_STRICT = 0,
  /* params of the store that the file lacks keep their values */
  QKV_CHECKPOINT_ALLOW_MISSING = 1 << 0,
  /* tensors of the file that the store lacks are ignored */
  QKV_CHECKPOINT_ALLOW_UNEXPECTED = 1 << 1,
} QkvCheckpointFlags;

/**
 * QkvCheckpointDType:
 * @QKV_CHECKPOINT_DTYPE_F32: f32
 * @QKV_CHECKPOINT_DTYPE_BF16: bf16
 *
 * The dtype qkv_checkpoint_save_full() writes parameter values in.
 */
typedef enum {
  QKV_CHECKPOINT_DTYPE_F32 = 0,
  QKV_CHECKPOINT_DTYPE_BF16 = 1,
} QkvCheckpointDType;

/**
 * qkv_checkpoint_save:
 * @path: the path
 * @params: (nullable): a #QkvParams
 * @optimizer: (nullable): a #QkvOptimizer
 * @schedule: (nullable): a #QkvSchedule
 * @metadata: (nullable) (element-type utf8 utf8): the metadata
 * @error: return location for a #GError, or %NULL
 *
 * Write params (and, if not NULL, optimizer state and schedule position, and
 * string→string metadata) to path, atomically. The same as
 * qkv_checkpoint_save_full() with QKV_CHECKPOINT_DTYPE_F32.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_checkpoint_save(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                             QkvSchedule *schedule, GHashTable *metadata, GError **error);

/**
 * qkv_checkpoint_save_full:
 * @path: the path
 * @params: a #QkvParams
 * @optimizer: (nullable): a #QkvOptimizer
 * @schedule: (nullable): a #QkvSchedule
 * @metadata: (nullable) (element-type utf8 utf8): the metadata
 * @param_dtype: the param dtype
 * @error: return location for a #GError, or %NULL
 *
 * qkv_checkpoint_save() with the parameter values written as param_dtype.
 * QKV_CHECKPOINT_DTYPE_BF16 halves their size: every value is rounded to
 * bfloat16 as IEEE 754 rounds, to nearest with ties to even, subnormals
 * too (nothing is flushed to zero); values past the largest bfloat16 by half
 * an ulp or more become infinity, infinities stay, and a NaN stays a NaN of
 * the same sign, made quiet (its payload cut to bfloat16's 7 bits).
 * Optimizer states stay F32 and step counts I32 whatever param_dtype is, so
 * a run resumed from a BF16 file continues from rounded parameters but the
 * exact optimizer state: lossy in the parameters only.
 * The F32 and I32 tensors' data comes first in the file, then the BF16, so
 * every tensor starts at a multiple of its element size.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_checkpoint_save_full(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                                  QkvSchedule *schedule, GHashTable *metadata,
                                  QkvCheckpointDType param_dtype, GError **error);

/**
 * qkv_checkpoint_load:
 * @path: (nullable): the path
 * @params: (nullable): a #QkvParams
 * @optimizer: (nullable): a #QkvOptimizer
 * @schedule: (nullable): a #QkvSchedule
 * @flags: the flags
 * @missing: (out) (optional) (transfer container) (element-type utf8): the missing
 * @unexpected: (out) (optional) (transfer container) (element-type utf8): the unexpected
 * @error: return location for a #GError, or %NULL
 *
 * Read path into params, and if not NULL optimizer (its state tensors in the
 * store, step count, hyper-parameters and group settings; the file must hold
 * state of an optimizer of the same kind) and schedule (its position; same
 * kind). The optimizer's parameter groups must be the file's: as many added
 * groups, each with the same pattern (or none) and a filter where the file's
 * had one, and every param of the store that the file holds in the same group
 * there as in the optimizer (filters cannot be saved, so this is how they
 * are compared); any difference is a QKV_ERROR_INVALID_ARGUMENT naming it
 * (a file saved without groups fits only an optimizer without them). The
 * lr factor and weight decay of each group are then the file's.
 * Without an optimizer, "__optim__." tensors are ignored. With one, the state
 * of every loaded param becomes exactly the file's (states the file lacks are
 * dropped). On success, if missing/unexpected are not NULL, they receive the
 * names of the store's params the file lacks and of the file's tensors the
 * store lacks (new arrays of strings; empty in strict mode).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_checkpoint_load(const gchar *path, QkvParams *params, QkvOptimizer *optimizer,
                             QkvSchedule *schedule, QkvCheckpointFlags flags, GPtrArray **missing,
                             GPtrArray **unexpected, GError **error);

/**
 * qkv_checkpoint_read_metadata:
 * @path: the path
 * @error: return location for a #GError, or %NULL
 *
 * The "__metadata__" map of a checkpoint (string → string; empty if none),
 * after checking the whole file as load does.
 *
 * Returns: (transfer container) (element-type utf8 utf8) (nullable): the result
 */
QKV_API
GHashTable *qkv_checkpoint_read_metadata(const gchar *path, GError **error);

/**
 * qkv_safetensors_read:
 * @path: the path
 * @metadata: (out) (optional) (transfer container) (element-type utf8 utf8): the metadata
 * @error: return location for a #GError, or %NULL
 *
 * Read any safetensors file: name → new QkvTensor* (F32, BF16, F16 and F64
 * as f32, converted as qkv_checkpoint_load() does: exactly, F64 rounded; I32,
 * and I64 whose values fit, as i32; other dtypes are a QKV_ERROR_DTYPE), and
 * its metadata if metadata is not NULL. qkv has no half-precision tensors:
 * a tensor's dtype says what it holds now, not what the file held.
 *
 * Returns: (transfer container) (element-type utf8 QkvTensor) (nullable): the result
 */
QKV_API
GHashTable *qkv_safetensors_read(const gchar *path, GHashTable **metadata, GError **error);

G_END_DECLS
