/* decode-precision.c: the precision of a step decoder's matrix products.
 * Both of a decoder's plans (the encoder's and the step's) take it, so an
 * encoding and the steps after it round alike. Kept apart from decode.c,
 * which builds the plans: this only reads and sets them. */
#include "decode-internal.h"
#include "error-private.h"

gboolean
qkv_step_decoder_try_set_precision(QkvStepDecoder *decoder, QkvPrecision precision, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(decoder != NULL, FALSE);
  /* checked here, not left to the plans' setter, so that the message names
   * this function and neither plan changes */
  if (precision != QKV_PRECISION_FP32 && precision != QKV_PRECISION_BF16) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_step_decoder_try_set_precision: precision %d is not a QkvPrecision "
                "(QKV_PRECISION_FP32 = %d or QKV_PRECISION_BF16 = %d)",
                (int)precision, (int)QKV_PRECISION_FP32, (int)QKV_PRECISION_BF16);
    return FALSE;
  }
  /* a valid precision: neither plan can refuse it */
  if (decoder->enc_plan != NULL)
    qkv_plan_try_set_precision(decoder->enc_plan, precision, error);
  if (decoder->step_plan != NULL)
    qkv_plan_try_set_precision(decoder->step_plan, precision, error);
  return TRUE;
}

void
qkv_step_decoder_set_precision(QkvStepDecoder *decoder, QkvPrecision precision)
{
  g_return_if_fail(decoder != NULL);
  /* a bad value is a caller's bug here: loud, as g_return_if_fail was */
  g_autoptr(GError) error = NULL;
  if (!qkv_step_decoder_try_set_precision(decoder, precision, &error))
    g_critical("%s", error->message);
}

QkvPrecision
qkv_step_decoder_get_precision(const QkvStepDecoder *decoder)
{
  g_return_val_if_fail(decoder != NULL, QKV_PRECISION_FP32);
  return decoder->step_plan != NULL ? qkv_plan_get_precision(decoder->step_plan)
                                    : QKV_PRECISION_FP32;
}
