/* decode-precision.c: the precision of a step decoder's matrix products.
 * Both of a decoder's plans (the encoder's and the step's) take it, so an
 * encoding and the steps after it round alike. Kept apart from decode.c,
 * which builds the plans: this only reads and sets them. */
#include "decode-internal.h"

void
qkv_step_decoder_set_precision(QkvStepDecoder *decoder, QkvPrecision precision)
{
  g_return_if_fail(decoder != NULL);
  g_return_if_fail(precision == QKV_PRECISION_FP32 || precision == QKV_PRECISION_BF16);
  if (decoder->enc_plan != NULL)
    qkv_plan_set_precision(decoder->enc_plan, precision);
  if (decoder->step_plan != NULL)
    qkv_plan_set_precision(decoder->step_plan, precision);
}

QkvPrecision
qkv_step_decoder_get_precision(const QkvStepDecoder *decoder)
{
  g_return_val_if_fail(decoder != NULL, QKV_PRECISION_FP32);
  return decoder->step_plan != NULL ? qkv_plan_get_precision(decoder->step_plan)
                                    : QKV_PRECISION_FP32;
}
