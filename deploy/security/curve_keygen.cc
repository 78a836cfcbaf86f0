// Writes a new CURVE key pair (Z85, 40 characters each, one line) to
// PUBLIC_FILE and SECRET_FILE, created with mode 0600; existing files are
// never overwritten. Used by make_job_keys.sh.
//
// Usage: curve_keygen PUBLIC_FILE SECRET_FILE
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>

#include "zmq.h"

namespace {

bool WriteNew(const char* path, const char* key) {
  const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    std::cerr << "curve_keygen: cannot create " << path << ": " << std::strerror(errno)
              << "\n";
    return false;
  }
  const std::string line = std::string(key) + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (close(fd) != 0 || !ok) {
    std::cerr << "curve_keygen: cannot write " << path << "\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: curve_keygen PUBLIC_FILE SECRET_FILE\n";
    return 2;
  }
  char public_key[41];
  char secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    std::cerr << "curve_keygen: zmq_curve_keypair: " << zmq_strerror(zmq_errno())
              << " (libzmq built without CURVE?)\n";
    return 1;
  }
  if (!WriteNew(argv[1], public_key) || !WriteNew(argv[2], secret_key)) return 1;
  return 0;
}
