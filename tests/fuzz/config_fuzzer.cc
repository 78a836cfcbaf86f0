// Fuzz target: the job configuration loader (common/config.h
// ParseJobConfig: text proto -> defaults -> validation).
//
// Input: the text of a config file. Beyond not crashing, a config that
// loads must keep the loader's promises: it validates again, applying
// defaults again changes nothing, and its printed text loads back to the
// same config (so psnode --print output is a loadable file).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "google/protobuf/text_format.h"
#include "proto/config.pb.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ps::JobConfig> config = ps::ParseJobConfig(text, "fuzz.pbtxt");
  if (!config.ok()) {
    PS_FUZZ_CHECK(absl::IsInvalidArgument(config.status()),
                  config.status().ToString());
    return 0;
  }
  const absl::Status again = ps::ValidateJobConfig(*config);
  PS_FUZZ_CHECK(again.ok(), again.ToString());

  const uint64_t fingerprint = ps::ConfigFingerprint(*config);
  ps::JobConfig defaulted = *config;
  ps::ApplyDefaults(&defaulted);
  PS_FUZZ_CHECK(ps::ConfigFingerprint(defaulted) == fingerprint,
                "ApplyDefaults is not idempotent");

  for (const ps::TableConfig& table : config->tables()) {
    PS_FUZZ_CHECK(ps::FindTable(*config, table.name()).ok(), table.name());
  }

  std::string printed;
  PS_FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(*config, &printed), "print");
  absl::StatusOr<ps::JobConfig> reloaded = ps::ParseJobConfig(printed, "printed");
  PS_FUZZ_CHECK(reloaded.ok(), absl::StrCat(reloaded.status().ToString(), "\n", printed));
  PS_FUZZ_CHECK(ps::ConfigFingerprint(*reloaded) == fingerprint,
                absl::StrCat("printed config loads differently:\n", printed));
  return 0;
}
