// Forwarding header: the deterministic initialiser is common/initializer.h
// (//common:initializer). Kept only while server/server_test.cc, which is
// being restructured, still includes it; include common/initializer.h.
#ifndef PS_SERVER_INITIALIZER_H_
#define PS_SERVER_INITIALIZER_H_

#include "common/initializer.h"

#endif  // PS_SERVER_INITIALIZER_H_
