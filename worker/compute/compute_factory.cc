#include "worker/compute/compute_factory.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/compute/cpu_compute.h"

// Exported by libps_cuda.so (cuda_compute.cu).
using PsCreateCudaComputeFn = ps::Compute* (*)(int device, char* error,
                                               size_t error_len);

namespace ps {
namespace {

constexpr char kLibraryName[] = "libps_cuda.so";
// The library's path inside a runfiles tree (workspace name "ps").
constexpr char kRunfilesPath[] = "ps/worker/compute/libps_cuda.so";

struct CudaLibrary {
  PsCreateCudaComputeFn create = nullptr;  // nullptr when not loadable
  std::string error;                       // why, when create is nullptr
};

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Where libps_cuda.so may be, most specific first (see the header).
std::vector<std::string> CandidatePaths() {
  std::vector<std::string> paths;
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  const std::string exe = n > 0 ? std::string(buf, n) : "";
  const std::string dir = exe.empty() ? "" : Dirname(exe);
  if (!exe.empty()) {
    paths.push_back(absl::StrCat(dir, "/", kLibraryName));
    paths.push_back(absl::StrCat(exe, ".runfiles/", kRunfilesPath));
  }
  // Set by `bazel test` and `bazel run`, where the executable may be a
  // wrapper outside the runfiles tree it runs in.
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* value = std::getenv(var);
    if (value != nullptr && *value != '\0') {
      paths.push_back(absl::StrCat(value, "/", kRunfilesPath));
    }
  }
  if (!exe.empty()) {
    paths.push_back(absl::StrCat(dir, "/compute/", kLibraryName));
    paths.push_back(absl::StrCat(dir, "/../worker/compute/", kLibraryName));
  }
  return paths;
}

// Why the NVIDIA driver's library cannot be loaded, or "" when it can. The
// CUDA runtime loads libcuda.so.1 by this name and fails without it
// (cudaErrorInsufficientDriver), so a machine without it has no usable GPU:
// checked first, it spares a CPU worker the load of cuBLAS and the runtime
// (0.2 to 0.5 s at every start). The handle stays open for the runtime.
std::string DriverMissing() {
  if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr) return "";
  const char* err = dlerror();
  return absl::StrCat("no NVIDIA driver (",
                      err != nullptr ? err : "libcuda.so.1 cannot be loaded",
                      ")");
}

CudaLibrary LoadCudaLibrary() {
  const std::vector<std::string> paths = CandidatePaths();
  for (const std::string& path : paths) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    if (st.st_size == 0) {
      // The genrule's placeholder when the CUDA toolkit was absent at build
      // time: dlopen would only say "file too short".
      return {nullptr, absl::StrCat("built without CUDA (", path,
                                    " is an empty placeholder)")};
    }
    if (std::string missing = DriverMissing(); !missing.empty()) {
      return {nullptr, std::move(missing)};
    }
    // RTLD_LOCAL: the library's symbols (cuBLAS, cudart) stay out of the
    // global namespace. The handle is never closed: the Computes it creates
    // run its code until the process exits.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = dlerror();
      return {nullptr, absl::StrCat("cannot load ", path, ": ",
                                    err != nullptr ? err : "dlopen failed")};
    }
    void* symbol = dlsym(handle, "PsCreateCudaCompute");
    if (symbol == nullptr) {
      return {nullptr,
              absl::StrCat(path, " does not export PsCreateCudaCompute")};
    }
    return {reinterpret_cast<PsCreateCudaComputeFn>(symbol), ""};
  }
  return {nullptr, absl::StrCat(kLibraryName, " not found (looked for ",
                                absl::StrJoin(paths, ", "), ")")};
}

// Loaded once per process; a thread-safe static.
const CudaLibrary& GetCudaLibrary() {
  static const CudaLibrary* const library =
      new CudaLibrary(LoadCudaLibrary());
  return *library;
}

// The CUDA Compute on device 0, or nullptr with the reason in *why.
std::unique_ptr<Compute> TryCreateGpu(std::string* why) {
  const CudaLibrary& library = GetCudaLibrary();
  if (library.create == nullptr) {
    *why = library.error;
    return nullptr;
  }
  char error[1024] = {};
  Compute* compute = library.create(/*device=*/0, error, sizeof(error));
  if (compute == nullptr) {
    *why = error[0] != '\0' ? error : "PsCreateCudaCompute failed";
    return nullptr;
  }
  return std::unique_ptr<Compute>(compute);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Compute>> CreateCompute(ComputeDevice device,
                                                        int threads,
                                                        std::string* why_cpu) {
  std::string why;
  switch (device) {
    case AUTO: {
      std::unique_ptr<Compute> gpu = TryCreateGpu(&why);
      if (gpu != nullptr) {
        if (why_cpu != nullptr) why_cpu->clear();
        return std::move(gpu);
      }
      if (why_cpu != nullptr) *why_cpu = absl::StrCat("no usable GPU: ", why);
      return CreateCpuCompute(threads);
    }
    case CPU:
      if (why_cpu != nullptr) *why_cpu = "CPU requested";
      return CreateCpuCompute(threads);
    case GPU: {
      std::unique_ptr<Compute> gpu = TryCreateGpu(&why);
      if (gpu == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("device GPU requested but no GPU is usable: ", why));
      }
      if (why_cpu != nullptr) why_cpu->clear();
      return std::move(gpu);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown ComputeDevice ", static_cast<int>(device)));
  }
}

bool GpuAvailable(std::string* why) {
  std::string reason;
  const bool available = TryCreateGpu(&reason) != nullptr;
  if (why != nullptr) *why = std::move(reason);
  return available;
}

}  // namespace ps
