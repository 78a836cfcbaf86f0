// Writes the generated part of the fuzz seed corpora into the directory
// given as argv[1] (tests/fuzz/corpus): real data-plane requests and
// responses in the wire fuzzer's framing, a checkpoint written by the real
// writer (server/checkpoint.h WriteShard/WriteManifest) in the checkpoint
// fuzzer's framing, and Fashion-MNIST idx files. The text seeds (configs,
// Criteo and libsvm lines) are plain files kept in the corpus directly.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "server/checkpoint.h"
#include "server/table.h"
#include "zmq.hpp"

namespace ps {
namespace {

namespace fs = std::filesystem;

void Append32(std::string* s, uint32_t v) { s->append(reinterpret_cast<char*>(&v), 4); }
void Append64(std::string* s, uint64_t v) { s->append(reinterpret_cast<char*>(&v), 8); }

void WriteOrDie(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::string ReadOrDie(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// ------------------------------------------------------------ wire

std::string Frames(uint8_t flags, const std::vector<std::string>& frames) {
  std::string s(1, static_cast<char>(flags));
  Append32(&s, static_cast<uint32_t>(frames.size()));
  for (const std::string& f : frames) {
    Append32(&s, static_cast<uint32_t>(f.size()));
    s += f;
  }
  return s;
}

std::string Bytes(const google::protobuf::MessageLite& m) {
  zmq::message_t frame = SerializeToFrame(m);
  return std::string(static_cast<const char*>(frame.data()), frame.size());
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string Encoded(ValueEncoding encoding, const std::vector<float>& v) {
  std::string out(v.size() * EncodedValueBytes(encoding), '\0');
  EncodeValues(encoding, v.data(), v.size(), out.data());
  return out;
}

void WireSeeds(const fs::path& dir) {
  const std::vector<uint64_t> keys = {7, 1ull << 40, 123456789};
  std::vector<float> values;
  for (int i = 0; i < 12; ++i) values.push_back(0.25f * i - 1.0f);
  auto header = [&](Op op) {
    RequestHeader h;
    h.set_request_id(42);
    h.set_op(op);
    h.set_table_id(1);
    h.set_num_keys(keys.size());
    h.set_epoch(3);
    h.set_sender_rank(1);
    h.set_clock(5);
    h.set_sender_node_id(9);
    h.set_seq(11);
    return h;
  };
  WriteOrDie(dir / "pull", Frames(0, {Bytes(header(PULL)), Bytes(keys)}));
  WriteOrDie(dir / "push", Frames(0, {Bytes(header(PUSH)), Bytes(keys), Bytes(values)}));
  WriteOrDie(dir / "push_misaligned",
             Frames(3 << 1, {Bytes(header(PUSH)), Bytes(keys), Bytes(values)}));
  {
    RequestHeader h = header(PUSH_PULL);
    h.set_push_values(FLOAT16);
    h.set_pull_values(BFLOAT16);
    WriteOrDie(dir / "push_pull_half",
               Frames(0, {Bytes(h), Bytes(keys), Encoded(FLOAT16, values)}));
    h.set_push_values(BFLOAT16);
    WriteOrDie(dir / "push_pull_bf16",
               Frames(5 << 1, {Bytes(h), Bytes(keys), Encoded(BFLOAT16, values)}));
  }
  {
    RequestHeader h = header(PUSH);
    h.set_table_id(2);
    h.set_num_keys(0);
    DenseSegment* s = h.add_segments();
    s->set_begin(0);
    s->set_length(8);
    s = h.add_segments();
    s->set_begin(16);
    s->set_length(4);
    WriteOrDie(dir / "push_dense",
               Frames(0, {Bytes(h), "", Bytes(std::vector<float>(values.begin(), values.end()))}));
    h.set_op(ASSIGN);
    WriteOrDie(dir / "assign_dense", Frames(0, {Bytes(h), "", Bytes(values)}));
    h.set_op(PULL);
    WriteOrDie(dir / "pull_dense", Frames(0, {Bytes(h), ""}));
  }
  {
    RequestHeader h = header(PULL);
    h.set_key_list_slot(5);
    h.set_key_list_digest(KeyListDigest(keys));
    WriteOrDie(dir / "pull_key_list_send", Frames(0, {Bytes(h), Bytes(keys)}));
    WriteOrDie(dir / "pull_key_list_cached", Frames(0, {Bytes(h), ""}));
  }
  {
    RequestHeader h = header(SCAN);
    h.set_num_keys(0);
    h.set_scan_cursor(77);
    h.set_scan_max_rows(100);
    WriteOrDie(dir / "scan", Frames(0, {Bytes(h), ""}));
  }
  {
    RequestHeader h = header(ADVANCE_CLOCK);
    h.set_num_keys(0);
    WriteOrDie(dir / "advance_clock", Frames(0, {Bytes(h), ""}));
    h.set_op(STATS);
    WriteOrDie(dir / "stats", Frames(0, {Bytes(h), ""}));
    h.set_op(PUSH);
    h.set_replica(true);
    h.mutable_replica_info();
    WriteOrDie(dir / "push_replica", Frames(0, {Bytes(h), "", ""}));
  }
  // Responses (flags bit 0).
  {
    ResponseHeader r;
    r.set_request_id(42);
    r.set_epoch(3);
    r.set_num_values(values.size());
    r.set_min_clock(4);
    r.set_applied_clock(5);
    WriteOrDie(dir / "response_pull", Frames(1, {Bytes(r), Bytes(values)}));
    r.set_values_encoding(FLOAT16);
    WriteOrDie(dir / "response_pull_half", Frames(1 | (1 << 1), {Bytes(r), Encoded(FLOAT16, values)}));
    r.set_values_encoding(FLOAT32);
    r.set_num_keys(3);
    r.set_next_cursor(99);
    WriteOrDie(dir / "response_scan", Frames(1, {Bytes(r), Bytes(values), Bytes(keys)}));
    ResponseHeader e;
    e.set_request_id(42);
    e.set_code(3);
    e.set_message("table 9 does not exist");
    e.set_wrong_owner(true);
    e.set_key_list_unknown(true);
    e.add_table_stats();
    WriteOrDie(dir / "response_error", Frames(1, {Bytes(e)}));
  }
}

// ------------------------------------------------------------ checkpoint

TableConfig Sparse(uint32_t id, uint32_t dim, bool ttl) {
  TableConfig c;
  c.set_id(id);
  c.set_name(absl::StrCat("emb", id));
  c.mutable_sparse()->set_dim(dim);
  if (ttl) {
    c.mutable_sparse()->set_ttl_steps(1000);
    AdamConfig* adam = c.mutable_optimizer()->mutable_adam();
    adam->set_learning_rate(0.01f);
    adam->set_beta1(0.9f);
    adam->set_beta2(0.999f);
    adam->set_epsilon(1e-8f);
  } else {
    c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
    c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
    c.mutable_optimizer()->mutable_adagrad()->set_epsilon(1e-8f);
  }
  c.mutable_init()->set_kind(InitializerConfig::NORMAL);
  c.mutable_init()->set_scale(0.01f);
  return c;
}

TableConfig Dense(uint32_t id) {
  TableConfig c;
  c.set_id(id);
  c.set_name("mlp");
  c.mutable_dense()->set_size(20);
  c.mutable_dense()->set_block_size(8);  // the last block is short
  c.mutable_optimizer()->mutable_momentum()->set_learning_rate(0.05f);
  c.mutable_optimizer()->mutable_momentum()->set_momentum(0.9f);
  return c;
}

std::string CheckpointInput(uint8_t flags, uint64_t clock, const std::string& bytes) {
  std::string s(1, static_cast<char>(flags));
  Append64(&s, clock);
  return s + bytes;
}

void CheckpointSeeds(const fs::path& dir) {
  std::vector<std::unique_ptr<Table>> tables;
  for (const TableConfig& c : {Sparse(1, 4, false), Sparse(2, 3, true), Dense(3)}) {
    auto t = Table::Create(c);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      std::exit(1);
    }
    tables.push_back(std::move(*t));
  }
  const std::vector<uint64_t> keys = {3, 8, 1ull << 50};
  for (auto& t : tables) {
    if (SparseTable* sparse = t->AsSparse()) {
      std::vector<float> grads(keys.size() * sparse->dim(), 0.5f);
      sparse->Advance(1, absl::UnixEpoch() + absl::Seconds(1));
      sparse->Push(keys, grads.data());
    } else {
      DenseTable* dense = t->AsDense();
      Segments segments;
      DenseSegment* s = segments.Add();
      s->set_begin(0);
      s->set_length(dense->BlockLength(0));
      std::vector<float> grads(s->length(), -0.25f);
      dense->Push(segments, grads.data());
    }
  }
  std::vector<const Table*> ptrs;
  for (auto& t : tables) ptrs.push_back(t.get());
  const fs::path tmp = fs::temp_directory_path() / "ps-make-seed-corpus";
  fs::remove_all(tmp);
  const std::string ckpt = CheckpointPath(tmp.string(), 7);
  auto shard = WriteShard(ckpt, 0, 7, 64, ptrs);
  if (!shard.ok()) {
    std::fprintf(stderr, "%s\n", shard.status().ToString().c_str());
    std::exit(1);
  }
  CheckpointManifest manifest;
  manifest.set_clock(7);
  manifest.set_num_servers(1);
  manifest.set_num_slots(64);
  *manifest.add_shards() = *shard;
  absl::Status s = WriteManifest(ckpt, manifest);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
  const std::string shard_bytes = ReadOrDie(fs::path(ckpt) / shard->file());
  const std::string manifest_file = ReadOrDie(fs::path(ckpt) / kManifestFileName);
  WriteOrDie(dir / "shard", CheckpointInput(0, 7, shard_bytes));
  WriteOrDie(dir / "shard_as_written", CheckpointInput(2, 7, shard_bytes));
  WriteOrDie(dir / "shard_filtered", CheckpointInput(4, 7, shard_bytes));
  WriteOrDie(dir / "shard_wrong_clock", CheckpointInput(0, 8, shard_bytes));
  WriteOrDie(dir / "manifest_payload", CheckpointInput(1, 7, manifest.SerializeAsString()));
  WriteOrDie(dir / "manifest_file", CheckpointInput(3, 7, manifest_file));
  fs::remove_all(tmp);
}

// ------------------------------------------------------------ idx

std::string Idx(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string s;
  auto big = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(v >> shift));
  };
  big(magic);
  for (uint32_t d : dims) big(d);
  return s + data;
}

void IdxSeeds(const fs::path& dir) {
  const std::string labels = Idx(0x00000801, {3}, std::string("\x01\x09\x00", 3));
  std::string pixels(3 * 28 * 28, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i * 7);
  const std::string images = Idx(0x00000803, {3, 28, 28}, pixels);
  auto input = [&](uint8_t options, const std::string& l, const std::string& i) {
    std::string s = {static_cast<char>(2), static_cast<char>(options)};
    Append32(&s, static_cast<uint32_t>(l.size()));
    return s + l + i;
  };
  WriteOrDie(dir / "fashion_mnist", input(0x10, labels, images));
  WriteOrDie(dir / "fashion_mnist_2_workers", input(0x24, labels, images));
  WriteOrDie(dir / "fashion_mnist_bad_label",
             input(0x00, Idx(0x00000801, {3}, std::string("\x01\x0a\x00", 3)), images));
  WriteOrDie(dir / "fashion_mnist_count_mismatch",
             input(0x00, Idx(0x00000801, {2}, std::string("\x01\x02", 2)), images));
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root(argv[1]);
  ps::WireSeeds(root / "wire_decoder");
  ps::CheckpointSeeds(root / "checkpoint_reader");
  ps::IdxSeeds(root / "data_readers");
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
