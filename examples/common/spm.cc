// spm.cc: spm.h over libsentencepiece (C++). Nothing here throws: the
// library reports through util::Status, which becomes a GError.
#include "spm.h"

#include <gio/gio.h>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <memory>
#include <string>
#include <vector>

struct Spm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace
{

// The sentences of a GPtrArray, one by one, as the trainer reads them.
class ArrayIterator : public sentencepiece::SentenceIterator
{
public:
  explicit ArrayIterator(GPtrArray *sentences) : sentences_(sentences)
  {
    Load();
  }
  bool done() const override
  {
    return index_ >= sentences_->len;
  }
  void Next() override
  {
    index_++;
    Load();
  }
  const std::string &value() const override
  {
    return value_;
  }
  sentencepiece::util::Status status() const override
  {
    return {};
  }

private:
  void Load()
  {
    if (!done())
      value_ = static_cast<const char *>(g_ptr_array_index(sentences_, index_));
  }
  GPtrArray *sentences_;
  guint index_ = 0;
  std::string value_;
};

gboolean
check(const sentencepiece::util::Status &status, const char *what, GError **error)
{
  if (status.ok())
    return TRUE;
  g_set_error(error, G_IO_ERROR, G_IO_ERROR_FAILED, "SentencePiece: %s: %s", what,
              status.ToString().c_str());
  return FALSE;
}

} // namespace

gboolean
spm_available(void)
{
  return TRUE;
}

Spm *
spm_train(GPtrArray *sentences, gint vocab_size, const gchar *type, GError **error)
{
  if (g_strcmp0(type, "unigram") != 0 && g_strcmp0(type, "bpe") != 0) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                "SentencePiece model type '%s': use unigram or bpe", type ? type : "(null)");
    return NULL;
  }
  // <unk> <pad> <bos> <eos> and at least one piece of text
  if (vocab_size < 5 || sentences->len == 0) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                "SentencePiece: %d pieces from %u sentences: need 5 pieces or more (4 are "
                "reserved) and a sentence",
                vocab_size, sentences->len);
    return NULL;
  }
  // hard_vocab_limit=false: a small corpus gives fewer pieces instead of
  // an error; identity: the text is the caller's, as it preprocessed it;
  // character_coverage 1: every character of the text keeps a piece (the
  // French accents would otherwise be <unk> in a small corpus); one thread
  // so that training is deterministic.
  std::string args = "--model_type=" + std::string(type) +
                     " --vocab_size=" + std::to_string(vocab_size) +
                     " --hard_vocab_limit=false --normalization_rule_name=identity"
                     " --character_coverage=1.0 --num_threads=1 --minloglevel=2"
                     " --unk_id=0 --pad_id=1 --bos_id=2 --eos_id=3"
                     " --unk_piece=<unk> --pad_piece=<pad> --bos_piece=<bos> --eos_piece=<eos>";
  ArrayIterator it(sentences);
  std::string proto;
  if (!check(sentencepiece::SentencePieceTrainer::Train(args, &it, &proto), "training", error))
    return NULL;
  return spm_load_serialized(reinterpret_cast<const guint8 *>(proto.data()), proto.size(), error);
}

Spm *
spm_load_serialized(const guint8 *data, gsize len, GError **error)
{
  auto spm = std::make_unique<Spm>();
  std::string bytes(reinterpret_cast<const char *>(data), len);
  if (!check(spm->processor.LoadFromSerializedProto(bytes), "loading a model", error))
    return NULL;
  return spm.release();
}

Spm *
spm_load(const gchar *path, GError **error)
{
  gchar *contents = NULL;
  gsize len = 0;
  if (!g_file_get_contents(path, &contents, &len, error))
    return NULL;
  Spm *spm = spm_load_serialized(reinterpret_cast<const guint8 *>(contents), len, error);
  g_free(contents);
  if (spm == NULL)
    g_prefix_error(error, "%s: ", path);
  return spm;
}

GBytes *
spm_serialize(const Spm *spm)
{
  std::string proto = spm->processor.serialized_model_proto();
  return g_bytes_new(proto.data(), proto.size());
}

gboolean
spm_save(const Spm *spm, const gchar *path, GError **error)
{
  std::string proto = spm->processor.serialized_model_proto();
  return g_file_set_contents(path, proto.data(), static_cast<gssize>(proto.size()), error);
}

void
spm_free(Spm *spm)
{
  delete spm;
}

gint
spm_size(const Spm *spm)
{
  return spm->processor.GetPieceSize();
}

gchar *
spm_piece(const Spm *spm, gint id)
{
  if (id < 0 || id >= spm_size(spm))
    return NULL;
  return g_strdup(spm->processor.IdToPiece(id).c_str());
}

gchar **
spm_encode(const Spm *spm, const gchar *text)
{
  std::vector<std::string> pieces;
  // Encode fails only on a processor without a model, which spm_load*
  // never return; an empty list is the answer then.
  if (!spm->processor.Encode(text, &pieces).ok())
    pieces.clear();
  gchar **out = g_new0(gchar *, pieces.size() + 1);
  for (size_t i = 0; i < pieces.size(); i++)
    out[i] = g_strdup(pieces[i].c_str());
  return out;
}

gchar *
spm_decode(const Spm *spm, const gint32 *ids, gint n, GError **error)
{
  std::vector<int> v(ids, ids + n);
  for (gint i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= spm_size(spm)) {
      g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                  "SentencePiece: id %d (position %d) is outside the %d pieces", ids[i], i,
                  spm_size(spm));
      return NULL;
    }
  std::string text;
  if (!check(spm->processor.Decode(v, &text), "decoding", error))
    return NULL;
  return g_strdup(text.c_str());
}
