// Default options and suppressions for the sanitizer runtimes, linked into
// every binary of a sanitizer build (see BUILD for why they are compiled in).
//
// Rules for what may be suppressed: only reports whose every frame of
// interest is inside an uninstrumented Debian system library (grpc, protobuf,
// abseil, libzmq, openblas, ...), each with a comment saying why it is a
// false positive. Findings in this repository's code are fixed, never
// suppressed here.
//
// The runtimes call these hooks (weak in the runtime, strong here) before
// main(); an environment variable (ASAN_OPTIONS, ...) set by the user still
// takes precedence over the defaults below.

extern "C" {

// ASan: a report aborts (so a child process's death is seen by its test),
// leaks are checked at exit, and use-after-return stays off (gRPC's and
// libzmq's uninstrumented threads make its fake stacks expensive).
const char* __asan_default_options() {
  return "abort_on_error=1:detect_leaks=1:strict_init_order=1:"
         "detect_stack_use_after_return=0:print_suppressions=0";
}

// UBSan: every report is fatal and carries a stack.
const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}

const char* __lsan_default_options() { return "print_suppressions=0"; }

const char* __lsan_default_suppressions() {
  return "";
}

const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0";
}

const char* __tsan_default_suppressions() {
  return
      // abseil's Mutex deadlock detector (GraphCycles, on in Debian's
      // build) keeps its graph under an internal SpinLock that TSan cannot
      // see (tsan_absl_sync.cc annotates only the public Mutex API); its
      // memmove calls, seen through TSan's interceptor, race with each
      // other.
      "called_from_lib:libabsl_graphcycles_internal.so\n"
      // libzmq passes message buffers from its I/O threads to ours through
      // lock-free pipes (atomics in uninstrumented code): our first read of
      // a received frame looks unordered with the I/O thread's write of it
      // (recv and memcpy called from libzmq). Ignoring the interceptors
      // called from libzmq keeps those writes from being recorded at all:
      // suppressing each report instead (the race: line, for what remains)
      // costs TSan a linear search of every earlier suppressed address per
      // report, which with one per received frame stalled a trainer test
      // for minutes.
      "called_from_lib:libzmq.so\n"
      "race:libzmq.so\n"
      // absl::Status's payload is reference-counted with atomics inside
      // Debian's libabsl_status; the last Unref frees it after every other
      // holder (gRPC's threads formatting the status, a caller reading the
      // message of a copy a KVClient completion handed out) is done, an
      // ordering TSan cannot see (grpc_security_test,
      // kv_client_curve_test). UnrefNonInlined tail-calls operator delete,
      // so the stack shows the inline Status::Unref of the caller's
      // destructor; the template matches both names.
      "race:absl::*::Status::Unref\n"
      // OpenSSL's record buffers belong to gRPC's TLS transport, handed
      // between gRPC's threads under gRPC's own (uninstrumented) locks:
      // libssl's memcpy into a buffer another gRPC thread later copies out
      // (//scheduler:tls_test). Interceptors called from libssl only.
      "called_from_lib:libssl.so\n"
      // The same buffers' ciphers in libcrypto: a gRPC thread encrypts
      // into a record buffer (memcpy) that another frees when the channel
      // goes (tls_test, the Slurm job's scheduler).
      "called_from_lib:libcrypto.so\n"
      // CURVE: libzmq's I/O thread decrypts each frame with libsodium in
      // place (memmove inside crypto_secretbox_open) before handing it to
      // our thread through libzmq's lock-free pipe; the unwinder stops in
      // libsodium, so "race:libzmq.so" above does not see libzmq's frame
      // (a server's key-list digest of a received frame, Slurm job).
      "called_from_lib:libsodium.so\n"
      // gRPC's slices (serialized messages, read buffers) are filled on one
      // gRPC thread and sent, copied or freed on another, ordered by gRPC's
      // combiners and executors (uninstrumented atomics): sendmsg, memcpy
      // and free called from libgrpc race with the filling in TSan's eyes
      // (scheduler_test, drain_test, replication_test, kv_client_test).
      // Interceptors called from libgrpc only; our own handlers still run
      // instrumented.
      "called_from_lib:libgrpc.so\n"
      // gRPC's call arenas come from gpr_malloc (libgpr): a client thread
      // allocates the block, gRPC recycles it through its own queues, and a
      // server thread constructs the next request message in it (a vptr
      // write in our generated code). TSan sees the malloc as a write by the
      // first thread with no ordering to the second. Interceptors (malloc,
      // free, memcpy) called from libgpr only.
      "called_from_lib:libgpr.so\n"
      // The same for the sync server's per-call records (SyncRequest, its
      // grpc::Status and request buffers): libgrpc++ allocates them on the
      // thread that registers the method, gRPC queues them, and a server
      // thread fills them in (scheduler_test, drain_test, kv_client_test).
      "called_from_lib:libgrpc++.so\n"
      // The callback API's completion tags (grpcpp/support/callback_common.h,
      // inline in our code): a reactor's Finish on our thread (the view
      // long polls' answering thread, scheduler/view_watchers.h) sets the
      // tag, and gRPC's callback thread runs it once the completion queue,
      // uninstrumented, hands it over (consistency_test).
      "race:grpc::internal::CallbackWithSuccessTag\n"
      // gRPC's HTTP/2 headers and status details travel between its threads
      // as upb messages and absl::Cords; upb's memcpy of a Cord chunk built
      // by another gRPC thread looks unordered (grpc_security_test).
      "called_from_lib:libupb.so\n"
      "called_from_lib:libabsl_cord.so\n"
      // absl::Status's heap payload (message and payloads) is created by
      // one gRPC thread and copied by another after gRPC hands the status
      // over under its own locks (//common:grpc_security_test). Interceptors
      // called from libabsl_status only.
      "called_from_lib:libabsl_status.so\n"
      // RocksDB (the disk tier) hands memtables, their arenas and cached
      // blocks between its flush and compaction threads and the readers
      // through reference counts and skip lists of uninstrumented atomics:
      // a reader's memcmp in a memtable looks unordered with the flush
      // thread's delete[] of that memtable's arena once its last reference
      // went (server_disk_tier_test). Interceptors called from librocksdb
      // only.
      "called_from_lib:librocksdb.so\n"
      // DB::ReleaseSnapshot deletes RocksDB's snapshot record as a tail
      // call, so the delete looks called from the caller of ReleaseSnapshot
      // (DiskTier::Snapshot's destructor) rather than from librocksdb. The
      // flush thread reads the snapshot list in GetSnapshotContext; both
      // hold RocksDB's DB mutex (tiered_table_test, a checkpoint's snapshot
      // released while the table goes on).
      "race:rocksdb::DBImpl::GetSnapshotContext\n";
}

}  // extern "C"
