/* optim-private.h: the optimizer's layout, shared by optim.c (selection and
 * the update rules) and optim-groups.c (parameter groups). */
#pragma once

#include "core/core-private.h"
#include "qkv/qkv-optim.h"

typedef enum {
  SELECT_ALL,
  SELECT_NAMES,
  SELECT_FILTER,
} SelectMode;

/* An added group. A param is in it when its name matches spec (if any) and
 * filter accepts it (if any); at least one of the two is set. */
typedef struct {
  gchar *pattern;
  GPatternSpec *spec;
  QkvParamFilter filter;
  gpointer filter_data;
  double lr_factor;
  double weight_decay;
} OptimGroup;

struct _QkvOptimizer {
  QkvOptimizerKind kind;
  QkvParams *params;
  QkvOptimConfig config;
  gint64 step;
  SelectMode mode;
  GHashTable *selected; /* QkvParam* set, SELECT_NAMES */
  QkvParamFilter filter;
  gpointer filter_data;
  GPtrArray *groups; /* OptimGroup*: groups 1, 2, ...; group 0 is config itself */
  gint ref_count;    /* qkv_optimizer_ref(); qkv_optimizer_free() drops one */
};

void qkv_optim_group_free(gpointer group);

/* The hyper-parameters the params of group are updated with: the
 * optimizer's config, with lr scaled by the group's factor and its own weight
 * decay (group 0: the config as it is). */
void qkv_optimizer_group_config(const QkvOptimizer *opt, guint group, QkvOptimConfig *config);
