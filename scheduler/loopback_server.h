// For the scheduler's unit tests of a single callback method: a gRPC server
// serving one service on a loopback port the kernel picks, and a Scheduler
// stub connected to it. Test-only.
#ifndef PS_SCHEDULER_LOOPBACK_SERVER_H_
#define PS_SCHEDULER_LOOPBACK_SERVER_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "proto/scheduler.grpc.pb.h"

namespace ps::testing {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;  // null when it could not listen
  std::unique_ptr<Scheduler::Stub> stub;
};

// Starts `service` (not owned; it must outlive the server).
inline LoopbackServer ServeOnLoopback(grpc::Service* service) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(service);
  LoopbackServer out;
  out.server = builder.BuildAndStart();
  if (out.server != nullptr) {
    out.stub = Scheduler::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  return out;
}

}  // namespace ps::testing

#endif  // PS_SCHEDULER_LOOPBACK_SERVER_H_
