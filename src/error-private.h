/* error-private.h: the sticky-error check that every public function of the
 * library starts with (not installed). Errors are sticky: a function that
 * takes a GError ** and finds an error already there returns its failure
 * value at once, keeps that first error and does nothing else, so a chain of
 * calls needs one check at its end and never meets GLib's "GError set over
 * the top of a previous GError" warning.
 *
 * It needs nothing but GLib, so every layer may include it: the layers of
 * src/, and ops/ and graph/, which otherwise include no private header of
 * src/ (docs/architecture.md). */
#pragma once

#include <glib.h>

/* Return retval from the calling function when error holds an error. */
#define QKV_RETURN_IF_ERROR_SET(error, retval)                                                     \
  G_STMT_START                                                                                     \
  {                                                                                                \
    if ((error) != NULL && *(error) != NULL)                                                       \
      return (retval);                                                                             \
  }                                                                                                \
  G_STMT_END
