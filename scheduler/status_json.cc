#include "scheduler/status_json.h"

#include "google/protobuf/util/json_util.h"

namespace ps {

std::string StatusJson(const ClusterState& state, const std::string& job_name) {
  StatusReport report = state.Report();
  report.set_job_name(job_name);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Progress 0 and empty series are shown, not left out.
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(report, &json, options);
  if (!status.ok()) {
    // Only a message with invalid UTF-8 fails, and every string in the
    // report is checked or the scheduler's own.
    return "{\"error\":\"the status could not be written as JSON\"}";
  }
  return json;
}

}  // namespace ps
