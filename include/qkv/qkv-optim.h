/* qkv-optim.h: optimizers, gradient clipping and learning-rate schedules.
 *
 * An optimizer updates parameter values in place from their gradient buffers,
 * outside any graph, so its hyper-parameters (lr, weight decay, ...) may change
 * between steps without recompiling a plan. The update rules are PyTorch's
 * (torch.optim.SGD, Adam, AdamW, non-foreach, maximize=False, amsgrad=False),
 * computed in f32 per element like PyTorch's CPU kernels.
 *
 * Optimizer state lives in the store, as named state tensors of each param
 * (qkv_param_state()): "momentum_buffer" (SGD), "exp_avg", "exp_avg_sq" and a
 * scalar i32 "step" (Adam, AdamW: PyTorch's per-param state['step'], from 0
 * to G_MAXINT32; the optimizer's own count is 64-bit). As in
 * PyTorch, a state that does not exist yet is created on a param's first
 * update, so an optimizer made over a store that already holds state (say,
 * one a checkpoint restored) continues from it. The optimizer itself holds
 * only its hyper-parameters, its selection of params, its parameter groups
 * and a step count.
 *
 * Frozen params (qkv_param_set_frozen()) are skipped by every function here.
 *
 * A training loop:
 *
 *   qkv_schedule_step(schedule, opt);              sets the lr for this update
 *   qkv_plan_run(plan, &error);                    forward + backward
 *   qkv_optimizer_clip_grad_norm(opt, 1.0, QKV_CLIP_TORCH);
 *   qkv_optimizer_step(opt, &error);              (or both at once:
 *                                                  qkv_optimizer_step_clipped)
 *
 * This header holds no declarations of its own: it includes the four parts,
 * each of which can also be included alone:
 *   qkv-optim-optimizer.h   QkvOptimizer: SGD, Adam, AdamW, steps, clipping
 *   qkv-optim-groups.h      parameter groups (PyTorch's param_groups)
 *   qkv-optim-accumulate.h  gradient accumulation over a batch's parts
 *   qkv-optim-schedule.h    learning-rate schedules
 */
#pragma once

#include "qkv-optim-optimizer.h"
#include "qkv-optim-groups.h"
#include "qkv-optim-accumulate.h"
#include "qkv-optim-schedule.h"
