#include "worker/model_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/model_layout.h"

namespace ps {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'M', 'O', 'D', 'E', 'L', '1'};
// Sizes above these are corruption, not models (and would make a reader
// allocate without bound).
constexpr uint64_t kMaxConfigBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxFloats = uint64_t{1} << 36;

// FNV-1a over 64-bit words (then the tail bytes): fast enough for
// gigabyte files and catches truncation and bit flips.
class Checksum {
 public:
  void Add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 0x100000001b3ULL;
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

class Writer {
 public:
  explicit Writer(std::ofstream* out) : out_(out) {}
  void Bytes(const void* data, size_t n) {
    sum_.Add(data, n);
    out_->write(static_cast<const char*>(data),
                static_cast<std::streamsize>(n));
  }
  void U64(uint64_t v) { Bytes(&v, sizeof(v)); }
  uint64_t checksum() const { return sum_.value(); }

 private:
  std::ofstream* out_;
  Checksum sum_;
};

class Reader {
 public:
  explicit Reader(std::string data) : data_(std::move(data)) {}
  bool Bytes(void* out, size_t n) {
    if (data_.size() - pos_ < n) return false;
    std::memcpy(out, data_.data() + pos_, n);
    sum_.Add(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool U64(uint64_t* v) { return Bytes(v, sizeof(*v)); }
  size_t remaining() const { return data_.size() - pos_; }
  uint64_t checksum() const { return sum_.value(); }

 private:
  std::string data_;
  size_t pos_ = 0;
  Checksum sum_;
};

}  // namespace

absl::Status SaveModel(const std::string& path, const SavedModel& model) {
  uint32_t dim = model.sparse_dim;
  if (dim == 0) {
    absl::StatusOr<ModelLayout> layout = LayoutModel(model.config);
    if (layout.ok()) dim = layout->sparse_dim;
  }
  if (model.rows.size() != model.keys.size() * dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("model has ", model.keys.size(), " keys but ",
                     model.rows.size(), " sparse values for rows of ", dim));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    Writer w(&out);
    w.Bytes(kMagic, sizeof(kMagic));
    const std::string config = model.config.SerializeAsString();
    w.U64(config.size());
    w.Bytes(config.data(), config.size());
    w.U64(model.dense.size());
    w.Bytes(model.dense.data(), model.dense.size() * sizeof(float));
    w.U64(dim);
    w.U64(model.keys.size());
    w.Bytes(model.keys.data(), model.keys.size() * sizeof(uint64_t));
    w.Bytes(model.rows.data(), model.rows.size() * sizeof(float));
    const uint64_t sum = w.checksum();
    out.write(reinterpret_cast<const char*>(&sum), sizeof(sum));
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<SavedModel> LoadModel(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot open model file ", path));
  Reader r(std::string(std::istreambuf_iterator<char>(in), {}));
  auto bad = [&path](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  char magic[sizeof(kMagic)];
  if (!r.Bytes(magic, sizeof(magic)) ||
      std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return bad("not a model file (bad magic)");
  }
  SavedModel m;
  uint64_t config_bytes = 0;
  if (!r.U64(&config_bytes) || config_bytes > kMaxConfigBytes ||
      config_bytes > r.remaining()) {
    return bad("truncated or corrupt config");
  }
  std::string config(config_bytes, '\0');
  r.Bytes(config.data(), config.size());
  if (!m.config.ParseFromString(config)) return bad("corrupt config");
  uint64_t dense = 0;
  if (!r.U64(&dense) || dense > kMaxFloats ||
      dense * sizeof(float) > r.remaining()) {
    return bad("truncated dense part");
  }
  m.dense.resize(dense);
  r.Bytes(m.dense.data(), dense * sizeof(float));
  uint64_t dim = 0, rows = 0;
  if (!r.U64(&dim) || !r.U64(&rows) || dim > 65536 || rows > kMaxFloats ||
      rows * (sizeof(uint64_t) + dim * sizeof(float)) > r.remaining()) {
    return bad("truncated sparse part");
  }
  m.sparse_dim = static_cast<uint32_t>(dim);
  m.keys.resize(rows);
  m.rows.resize(rows * dim);
  r.Bytes(m.keys.data(), rows * sizeof(uint64_t));
  r.Bytes(m.rows.data(), m.rows.size() * sizeof(float));
  const uint64_t expected = r.checksum();
  uint64_t stored = 0;
  if (!r.U64(&stored) || r.remaining() != 0)
    return bad("truncated or trailing data");
  if (stored != expected) return bad("checksum mismatch");
  return m;
}

}  // namespace ps
