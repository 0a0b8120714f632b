/* qkv-ops.h: typed functions for the built-in primitive ops.
 *
 * Each adds one node to the graph its inputs belong to and returns its
 * (first) output, or NULL with a QKV_ERROR and the graph unchanged. The same
 * ops are reachable by name through qkv_graph_add_node(); the op name and its
 * attributes are given in each comment.
 *
 * This header holds no declarations of its own: it includes the three parts,
 * each of which can also be included alone:
 *   qkv-ops-basic.h   arithmetic, elementwise math, reductions, shape ops
 *   qkv-ops-nn.h      activations, normalisation, softmax, embedding,
 *                     losses, their gradient ops, Gumbel-softmax
 *   qkv-ops-select.h  comparisons, selection, masks, indexing, the
 *                     key/value cache and positions
 */
#pragma once

#include "qkv-ops-basic.h"
#include "qkv-ops-nn.h"
#include "qkv-ops-select.h"
