// Fuzz target: the training data readers (worker/data/dataset.h
// OpenDataset over Criteo TSV and libsvm text files and Fashion-MNIST idx
// files, worker/data/idx.h ReadIdx).
//
// Input: [u8 mode][u8 options][bytes].
//   mode % 3 == 0: the bytes are a Criteo TSV file; 1: a libsvm file;
//   2: [u32 n][n bytes: the labels idx file][rest: the images idx file]
//      (raw or gzip), opened as Fashion-MNIST and each read by ReadIdx.
//   options bit 0: on_bad_line FAIL instead of SKIP; bit 1: hash_buckets
//   1000; bits 2-3: number of workers - 1 (each worker's share is read);
//   bits 4-7: batch size - 1.
// Every batch returned must be well formed (sizes, offsets, fields and
// labels within the schema), and a reader must stop at the end of a pass.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "proto/config.pb.h"
#include "tests/fuzz/fuzz_files.h"
#include "tests/fuzz/fuzz_input.h"
#include "worker/data/dataset.h"
#include "worker/data/idx.h"

namespace {

using ps::data::ExampleBatch;
using ps::data::Schema;

void CheckBatch(const Schema& schema, const ExampleBatch& b, size_t n, size_t max) {
  PS_FUZZ_CHECK(n <= max && b.size == n, absl::StrCat(n, " of ", max));
  PS_FUZZ_CHECK(b.labels.size() == n, absl::StrCat(b.labels.size(), " labels"));
  PS_FUZZ_CHECK(b.num_dense == schema.num_dense, "num_dense");
  PS_FUZZ_CHECK(b.dense.size() == n * schema.num_dense, "dense size");
  PS_FUZZ_CHECK(b.offsets.size() == n + 1 && b.offsets[0] == 0, "offsets size");
  for (size_t i = 0; i < n; ++i) {
    PS_FUZZ_CHECK(b.offsets[i] <= b.offsets[i + 1], "offsets decrease");
    const float label = b.labels[i];
    PS_FUZZ_CHECK(label >= 0 && label < std::max<uint32_t>(schema.num_classes, 2),
                  absl::StrCat("label ", label));
  }
  const size_t features = b.offsets[n];
  PS_FUZZ_CHECK(b.keys.size() == features && b.values.size() == features &&
                    b.fields.size() == features,
                "feature arrays differ in size");
  for (uint32_t f : b.fields) {
    PS_FUZZ_CHECK(f < schema.num_fields || schema.num_fields == 0,
                  absl::StrCat("field ", f, " of ", schema.num_fields));
  }
}

// Reads every share of `config`'s training split to the end (bounded), and
// a second pass after Rewind of the first share.
void ReadAll(const ps::DataConfig& config, uint32_t workers, size_t batch) {
  for (uint32_t rank = 0; rank < workers; ++rank) {
    auto opened = ps::data::OpenDataset(config, ps::data::Split::kTrain, rank, workers,
                                        static_cast<uint32_t>(batch), false);
    if (!opened.ok()) return;
    ps::data::Dataset& ds = **opened;
    ExampleBatch b;
    for (int pass = 0; pass < (rank == 0 ? 2 : 1); ++pass) {
      uint64_t examples = 0;
      for (int step = 0; step < 100000; ++step) {
        absl::StatusOr<size_t> n = ds.Next(batch, &b);
        if (!n.ok()) continue;  // a bad line under FAIL: reading goes on
        CheckBatch(ds.schema(), b, *n, batch);
        examples += *n;
        if (*n == 0) break;
        PS_FUZZ_CHECK(step < 99999, "the pass does not end");
      }
      if (pass == 0 && rank == 0) {
        PS_FUZZ_CHECK(ds.Rewind().ok(), "rewind");
        absl::StatusOr<uint64_t> skipped = ds.Skip(examples / 2);
        if (skipped.ok()) PS_FUZZ_CHECK(*skipped <= examples / 2, "skipped too many");
      }
    }
  }
}

}  // namespace

// Bad lines are logged; at thousands of inputs a second that is all the
// fuzzer would do.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)ps::SetLogLevel("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::Input in(data, size);
  uint8_t mode = 0, options = 0;
  if (!in.U8(&mode) || !in.U8(&options)) return 0;
  const uint32_t workers = 1 + ((options >> 2) & 3);
  const size_t batch = 1 + (options >> 4);
  const std::string& dir = ps::fuzz::ScratchDir();
  ps::DataConfig config;

  if (mode % 3 == 2) {
    uint32_t n = 0;
    const uint8_t* labels = nullptr;
    if (!in.U32(&n) || !in.Bytes(n, &labels)) return 0;
    const std::string labels_path = dir + "/train-labels-idx1-ubyte";
    const std::string images_path = dir + "/train-images-idx3-ubyte";
    ps::fuzz::WriteFileOrDie(labels_path, labels, n);
    ps::fuzz::WriteFileOrDie(images_path, in.rest(), in.remaining());
    (void)ps::data::ReadIdx(labels_path, 0x00000801);
    (void)ps::data::ReadIdx(images_path, 0x00000803);
    config.mutable_fashion_mnist()->set_dir(dir);
    ReadAll(config, workers, batch);
    return 0;
  }

  const std::string path = dir + "/data.txt";
  ps::fuzz::WriteFileOrDie(path, in.rest(), in.remaining());
  ps::FileDataConfig* files = config.mutable_files();
  files->set_format(mode % 3 == 0 ? ps::FileDataConfig::CRITEO : ps::FileDataConfig::LIBSVM);
  files->add_train_files(path);
  files->set_on_bad_line((options & 1) != 0 ? ps::FAIL : ps::SKIP);
  if ((options & 2) != 0) files->set_hash_buckets(1000);
  ReadAll(config, workers, batch);
  return 0;
}
