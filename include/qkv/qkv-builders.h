/* qkv-builders.h: builders that add layers and models to a graph and create
 * their parameters in a QkvParams store, under the names the book's PyTorch
 * modules give them in their state_dict (so a state_dict saved as safetensors
 * loads as is). Builders use only the public API: anything they do, a user can
 * do too.
 *
 * A parameter a builder needs is reused when the store already has it with
 * the right shape (a training graph and an evaluation graph share weights),
 * created and initialised when it is missing, and an error when its shape
 * differs.
 *
 * This header holds no declarations of its own: it includes the four parts,
 * each of which can also be included alone (each includes what it needs):
 *   qkv-builders-core.h       QkvBuilder, its initialisers and cached mode,
 *                             name scopes, all-or-nothing steps, parameters
 *   qkv-builders-layers.h     linear, embedding, positions, FFN, norms, GRU
 *   qkv-builders-attention.h  multi-head and Luong attention, attention
 *                             pooling, Nadaraya-Watson regression
 *   qkv-builders-models.h     the Transformer, the GRU seq2seq models and
 *                             their loss, the pooling classifier
 */
#pragma once

#include "qkv-builders-core.h"
#include "qkv-builders-layers.h"
#include "qkv-builders-attention.h"
#include "qkv-builders-models.h"
