/* The parameter server's C ABI: what the Python package (python/ps) loads
 * with ctypes, and what any other language can bind to.
 *
 * Why a C ABI: one build of libps_native.so serves every CPython 3 and
 * every PyTorch version (nothing here links Python or libtorch), and it
 * travels in deploy/bundle.sh to hosts without Debian's packages.
 *
 * Conventions
 *  - Functions that can fail return a status code: 0 for OK, else an Abseil
 *    status code (3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 8
 *    RESOURCE_EXHAUSTED, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, ...). The
 *    message of the calling thread's last failure is ps_last_error().
 *  - Arrays cross as pointers and lengths, never element by element. Keys
 *    and gradients are copied before a call returns. A pull's output
 *    buffer is written by the library's I/O thread until its future is
 *    done: the caller keeps it alive until then (the Python package holds
 *    a reference in the future object, and closes the session before it
 *    lets go of outstanding ones).
 *  - Nothing here blocks without a bound: waits take a timeout and return
 *    PS_PENDING when it passes, so a binding can wait in short slices and
 *    react to signals (Ctrl-C) in between. Lifecycle calls that may block
 *    for long (start, barrier, finish, claim, checkpoint) run on a thread of
 *    their own and return a future.
 *  - No signal handlers are installed and the allocator is left alone.
 *  - A session used from a forked child (another pid than the one that
 *    started it) fails with FAILED_PRECONDITION and touches nothing: its
 *    threads do not exist in the child.
 *  - Thread safety: data-plane calls and futures may be used from any
 *    thread; the lifecycle calls of one session (end_step, barrier, claim,
 *    finish, leave) from one thread at a time, the one that issues the
 *    step's pushes (a step's pushes and its clock advance keep their order
 *    only when issued by one thread).
 */
#ifndef PS_PYTHON_NATIVE_PS_C_H_
#define PS_PYTHON_NATIVE_PS_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature below changes; the Python package refuses a
 * library of another version. */
#define PS_C_ABI_VERSION 1
/* Returned by waits whose timeout passed before the operation completed. */
#define PS_PENDING (-1)

/* ps_session_start flags. */
#define PS_TRAINS_SHARDS 1
#define PS_OBSERVER 2

typedef struct ps_session ps_session;
typedef struct ps_future ps_future;

int32_t ps_abi_version(void);
/* The message of this thread's last failed call ("" if none). Valid until
 * this thread's next call into the library. */
const char* ps_last_error(void);
/* trace|debug|info|warn|error|off; INVALID_ARGUMENT otherwise. */
int32_t ps_set_log_level(const char* level);

/* ---- utilities (no session) ---------------------------------------- */

/* The key the C++ readers give categorical field `field` with value
 * `value` (worker/data/keys.h CriteoKey), for n pairs. */
void ps_hash_keys(uint32_t field, const uint64_t* values, size_t n, uint64_t* out);

/* Loads and validates a job config file; *out_json receives a JSON
 * description (name, mode, cluster sizes, tables). Free it with
 * ps_free_string. */
int32_t ps_describe_config(const char* path, int64_t num_servers,
                           int64_t num_workers, char** out_json);
void ps_free_string(char* s);

/* The servers' initial values of table `table` (config file `path`) for n
 * keys (sparse: dim floats each, row-major) or, for a dense table, the
 * elements [keys[0], keys[0] + n) (keys may then be NULL with first given
 * in `first`). Deterministic: the same values every server creates. */
int32_t ps_initial_values(const char* path, const char* table,
                          const uint64_t* keys, size_t n, uint64_t first,
                          float* out, size_t out_len);

/* Synthetic CTR data of the job config at `path` (data.synthetic_ctr):
 * examples [begin, begin + count) of split 0 (train) or 1 (test).
 * numeric: count * num_numeric floats; keys: count * num_categorical;
 * labels: count; true_logits (may be NULL): count. Sizes are checked
 * against what the config implies. */
int32_t ps_synthetic_ctr(const char* path, int32_t split, uint64_t begin,
                         uint64_t count, float* numeric, size_t numeric_len,
                         uint64_t* keys, size_t keys_len, float* labels,
                         float* true_logits);

/* ---- session --------------------------------------------------------- */

/* Starts joining the job (register, wait for every server, data-plane
 * client) on a thread of its own; the future's session is taken with
 * ps_future_take_session once it is done. config_path: the job config
 * file every process of the job loads; num_servers / num_workers: 0 keeps
 * the config's. flags: PS_TRAINS_SHARDS for a training worker (its shard
 * is resumed by another if it dies), PS_OBSERVER for an observer (no
 * worker rank, no clock, never holds BSP/SSP back; it only reads: pushes
 * and the lifecycle calls fail with FAILED_PRECONDITION). stop_check_s:
 * the longest any wait of the session blocks before looking for a stop
 * (ps_session_request_stop); startup_timeout_s 0: the config's. */
int32_t ps_session_start(const char* config_path, const char* scheduler,
                         int64_t num_servers, int64_t num_workers,
                         int32_t flags, double stop_check_s,
                         double startup_timeout_s, ps_future** out);
/* Leaves (unfinished, no position) unless left, closes the data plane
 * (pending requests end CANCELLED) and frees the session. Lifecycle
 * operations still running (barrier, claim, finish, checkpoint) are asked
 * to stop and waited for first: they end (barrier, claim and finish with
 * CANCELLED) before the session goes, and their futures stay valid. In a
 * forked child it frees nothing (the parent's threads are not there) and
 * leaks. */
void ps_session_free(ps_session* s);
/* JSON: rank, node_id, observer, restored_start, start_clock, position (null or {shard,
 * epoch, batch, done}), job {name, mode, staleness, num_workers,
 * num_servers, prefetch, checkpoint_dir, tables}. */
int32_t ps_session_info(ps_session* s, char** out_json);
uint64_t ps_session_clock(ps_session* s);
/* For timeout messages under BSP/SSP: the live workers this one waits
 * for, e.g. "worker rank 1 (clock 3, last heard 20 ms ago)"; "" if none.
 * Free with ps_free_string. */
char* ps_session_slow_workers(ps_session* s);
/* The clock of the newest committed checkpoint of the job (0: none). */
uint64_t ps_session_last_checkpoint(ps_session* s);
/* 1 when a stop was requested (ps_session_request_stop, psctl drain). */
int32_t ps_session_stop_requested(ps_session* s);
/* 0 while the session can go on; else the status that ended it (message in
 * ps_last_error()): 10 ABORTED "dropped by the scheduler: ..." (declared
 * dead; every wait and request fails with it), or 14 UNAVAILABLE naming
 * cluster.scheduler_unreachable_timeout_ms (the scheduler gone). */
int32_t ps_session_ended(ps_session* s);
void ps_session_request_stop(ps_session* s);
/* Ends a step (clock + 1 on every live server, after this thread's
 * pushes); once acknowledged the position (if has_position) is reported
 * to the scheduler. */
int32_t ps_session_end_step(ps_session* s, int32_t has_position, uint32_t shard,
                            uint64_t epoch, uint64_t batch, int32_t done,
                            ps_future** out);
/* Barrier `name` of every live worker, bounded by timeout_s. The future's
 * text is the JSON list of ranks that arrived. */
int32_t ps_session_barrier(ps_session* s, const char* name, double timeout_s,
                           ps_future** out);
/* One claim round (see WorkerSession::Claim). The future's text is JSON:
 * {"result":"WAIT|ASSIGNED|ALL_DONE","shard":..,"epoch":..,"batch":..,
 *  "done":..,"start_clock":..}. */
int32_t ps_session_claim(ps_session* s, int32_t has_finished, uint32_t shard,
                         uint64_t epoch, uint64_t batch, ps_future** out);
int32_t ps_session_restart(ps_session* s, uint64_t clock);
/* Finish: the future's value is 1 on the worker that evaluates for the
 * job, 0 on the others (returned once the evaluator is done). */
int32_t ps_session_finish(ps_session* s, double timeout_s, ps_future** out);
int32_t ps_session_evaluation_done(ps_session* s);
/* A consistent checkpoint: the future's value is its clock. */
int32_t ps_session_checkpoint(ps_session* s, ps_future** out);
int32_t ps_session_leave(ps_session* s, int32_t finished, int32_t has_position,
                         uint32_t shard, uint64_t epoch, uint64_t batch,
                         int32_t done);

/* ---- data plane ------------------------------------------------------ */

/* Sparse tables: grads holds n * dim floats, out room for as many. */
int32_t ps_pull(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                float* out, size_t out_len, ps_future** f);
int32_t ps_push(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                const float* grads, size_t grads_len, ps_future** f);
int32_t ps_push_pull(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                     const float* grads, size_t grads_len, float* out,
                     size_t out_len, ps_future** f);
/* Dense tables: elements [begin, begin + n). */
int32_t ps_pull_dense(ps_session* s, uint32_t table, uint64_t begin, size_t n,
                      float* out, ps_future** f);
int32_t ps_push_dense(ps_session* s, uint32_t table, uint64_t begin,
                      const float* grads, size_t n, ps_future** f);
int32_t ps_assign_dense(ps_session* s, uint32_t table, uint64_t begin,
                        const float* values, size_t n, ps_future** f);
/* Every row of sparse table `table` (ps_future_scan_size / _copy). */
int32_t ps_scan(ps_session* s, uint32_t table, ps_future** f);
/* Statistics of every table on every live server; the future's text is a
 * JSON list of {server, table, rows, bytes, ...}. */
int32_t ps_stats(ps_session* s, ps_future** f);

/* ---- futures ----------------------------------------------------------- */

/* Waits at most timeout_s (0: just look): PS_PENDING if not done, else the
 * operation's status code (its message in ps_last_error()). */
int32_t ps_future_wait(ps_future* f, double timeout_s);
int32_t ps_future_done(ps_future* f);
/* Pulls: the slowest live worker's clock when the servers answered. */
uint64_t ps_future_min_clock(ps_future* f);
int64_t ps_future_value(ps_future* f);
/* A copy of the future's text result, free with ps_free_string; NULL if
 * none. */
char* ps_future_text(ps_future* f);
/* After a successful ps_session_start: takes the session (once). */
ps_session* ps_future_take_session(ps_future* f);
/* After a successful ps_scan: the number of rows and the row width, then
 * a copy of keys (rows) and values (rows * dim). */
int32_t ps_future_scan_size(ps_future* f, uint64_t* rows, uint32_t* dim);
int32_t ps_future_scan_copy(ps_future* f, uint64_t* keys, float* values);
/* Frees the handle. A lifecycle operation still running is asked to stop
 * first and waited for; a data-plane request still in flight keeps
 * running (its output buffer must stay valid until it completes or the
 * session is freed). */
void ps_future_free(ps_future* f);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* PS_PYTHON_NATIVE_PS_C_H_ */
