/* qkv-error.h: the QKV_ERROR domain.
 *
 * Every failure caused by user input (a bad shape, an unknown op, a corrupt
 * file, a broken plugin) is reported as a GError in this domain. Messages name
 * the op, the node, the shapes, the file and the byte offset where relevant.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>

G_BEGIN_DECLS

/**
 * QKV_ERROR:
 *
 * Error.
 */
#define QKV_ERROR (qkv_error_quark())

/**
 * QkvError:
 * @QKV_ERROR_INVALID_ARGUMENT: a bad argument that fits no other code
 * @QKV_ERROR_UNKNOWN_OP: no op of that name is registered
 * @QKV_ERROR_ARITY: wrong number of inputs
 * @QKV_ERROR_DTYPE: an input has the wrong element type
 * @QKV_ERROR_SHAPE: shapes that do not fit together
 * @QKV_ERROR_ATTRIBUTE: a missing, unknown or mistyped attribute
 * @QKV_ERROR_GRAPH_MISMATCH: a value that belongs to another graph
 * @QKV_ERROR_NO_GRADIENT: an op on the path to the loss has no gradient rule
 * @QKV_ERROR_NOT_FOUND: a name (input, parameter, tensor) that does not exist
 * @QKV_ERROR_EXISTS: a name that is already taken
 * @QKV_ERROR_UNBOUND: a graph input with no tensor bound when the plan runs
 * @QKV_ERROR_IO: reading or writing a file failed
 * @QKV_ERROR_CORRUPT: a file whose content is malformed
 * @QKV_ERROR_PLUGIN: a plugin that cannot be loaded
 * @QKV_ERROR_MEMORY: memory for a tensor, parameter or plan could not be had
 * @QKV_ERROR_BUSY: An object already in use by another thread: a plan being bound or run, a step
 *   decoder decoding, a parameter store whose gradient buffers a plan run is writing
 *   (docs/threads.md, "What may run concurrently"). Nothing was done; the call may be retried once
 *   the other one returns.
 * @QKV_ERROR_INDEX: A kernel found an index outside its range while a plan ran (a target of
 *   cross_entropy, an id of embedding, an index of gather or index_select); the run stopped at that
 *   node.
 *
 * The error values.
 */
typedef enum {
  QKV_ERROR_INVALID_ARGUMENT, /* a bad argument that fits no other code */
  QKV_ERROR_UNKNOWN_OP,       /* no op of that name is registered */
  QKV_ERROR_ARITY,            /* wrong number of inputs */
  QKV_ERROR_DTYPE,            /* an input has the wrong element type */
  QKV_ERROR_SHAPE,            /* shapes that do not fit together */
  QKV_ERROR_ATTRIBUTE,        /* a missing, unknown or mistyped attribute */
  QKV_ERROR_GRAPH_MISMATCH,   /* a value that belongs to another graph */
  QKV_ERROR_NO_GRADIENT,      /* an op on the path to the loss has no gradient rule */
  QKV_ERROR_NOT_FOUND,        /* a name (input, parameter, tensor) that does not exist */
  QKV_ERROR_EXISTS,           /* a name that is already taken */
  QKV_ERROR_UNBOUND,          /* a graph input with no tensor bound when the plan runs */
  QKV_ERROR_IO,               /* reading or writing a file failed */
  QKV_ERROR_CORRUPT,          /* a file whose content is malformed */
  QKV_ERROR_PLUGIN,           /* a plugin that cannot be loaded */
  QKV_ERROR_MEMORY,           /* memory for a tensor, parameter or plan could not be had */
  /* An object already in use by another thread: a plan being bound or run,
   * a step decoder decoding, a parameter store whose gradient buffers a
   * plan run is writing (docs/threads.md, "What may run concurrently").
   * Nothing was done; the call may be retried once the other one returns. */
  QKV_ERROR_BUSY,
  /* A kernel found an index outside its range while a plan ran (a target
   * of cross_entropy, an id of embedding, an index of gather or
   * index_select); the run stopped at that node. */
  QKV_ERROR_INDEX,
} QkvError;

/**
 * qkv_error_quark:
 *
 * Error quark.
 *
 * Returns: the GQuark
 */
QKV_API
GQuark qkv_error_quark(void);

G_END_DECLS
