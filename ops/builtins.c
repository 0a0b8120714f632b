/* builtins.c: the list of built-in op families, registered at init. */
#include "ops-common.h"

void
qkv_register_builtin_ops(void)
{
  qkv_register_ops_matmul();
  qkv_register_ops_elementwise();
  qkv_register_ops_reduce();
  qkv_register_ops_shape();
  qkv_register_ops_softmax();
  qkv_register_ops_embedding();
  qkv_register_ops_loss();
  qkv_register_ops_masked_softmax();
  qkv_register_ops_dot_attention();
  qkv_register_ops_mha();
  qkv_register_ops_dropout();
  qkv_register_ops_layer_norm();
  qkv_register_ops_ffn();
  qkv_register_ops_positional();
  qkv_register_ops_additive_attention();
  qkv_register_ops_compare();
  qkv_register_ops_select();
  qkv_register_ops_math();
  qkv_register_ops_argreduce();
  qkv_register_ops_index();
  qkv_register_ops_cast();
  qkv_register_ops_view();
}
