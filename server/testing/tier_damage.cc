#include "server/testing/tier_damage.h"

#include <filesystem>
#include <fstream>
#include <system_error>

namespace ps::testing {

int CorruptTierFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  int damaged = 0;
  std::error_code ec;
  // The tier's background work may remove files while this walks them.
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const fs::path path = it->path();
    if (path.extension() != ".sst") continue;
    std::error_code size_ec;
    const auto size = static_cast<std::streamoff>(fs::file_size(path, size_ec));
    if (size_ec) continue;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    if (!f) continue;
    const char junk[32] = {'\xa5', '\x5a', '\xa5', '\x5a',
                           '\xff', '\x00', '\x13', '\x37'};
    for (std::streamoff at = 64; at + 32 <= size; at += 4096) {
      f.seekp(at);
      f.write(junk, sizeof(junk));
    }
    f.flush();
    if (f) ++damaged;
  }
  return damaged;
}

}  // namespace ps::testing
