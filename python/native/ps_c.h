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
 *    message of the calling thread's last failure is ps_last_error(), its
 *    reason (dropped, scheduler unreachable; PS_REASON_*)
 *    ps_last_error_reason(). Results cross as the structs below, never as
 *    text to parse.
 *  - Arrays cross as pointers and lengths, never element by element. Keys
 *    and gradients are copied before a call returns. A pull's output
 *    buffer is written by the library's I/O thread until its future is
 *    done: the caller keeps it alive until then (the Python package holds
 *    a reference in the future object, and closes the session before it
 *    lets go of outstanding ones).
 *  - Nothing here blocks without a bound unless asked: waits take a timeout
 *    (PS_NO_TIMEOUT: none) and return
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

/* Bumped whenever a signature or a struct below changes; the Python package
 * refuses a library of another version. */
#define PS_C_ABI_VERSION 7
/* Returned by waits whose timeout passed before the operation completed. */
#define PS_PENDING (-1)
/* A timeout (seconds) that never passes: waits, barriers and finish given
 * it wait until done (or stopped). Any negative or non-finite timeout means
 * the same; 0 means "do not wait". */
#define PS_NO_TIMEOUT (-1.0)

/* ps_session_start flags. */
#define PS_TRAINS_SHARDS 1
#define PS_OBSERVER 2

/* Why the calling thread's last call failed, beyond its status code
 * (ps_last_error_reason). Carried with the status from where it arose, so
 * no binding matches message text. */
#define PS_REASON_NONE 0
/* 10 ABORTED: the scheduler dropped this worker (declared it dead); every
 * wait and request of the session fails with it. */
#define PS_REASON_DROPPED 1
/* 14 UNAVAILABLE: the scheduler stayed unreachable for longer than
 * cluster.scheduler_unreachable_timeout_ms. */
#define PS_REASON_SCHEDULER_UNREACHABLE 2
/* 9 FAILED_PRECONDITION: the job has finished (ps_session_start on a job
 * whose workers all finished): there is nothing left to join. */
#define PS_REASON_JOB_FINISHED 3
/* 9 FAILED_PRECONDITION: the job cannot continue (the scheduler made it
 * FAILED, e.g. slots lost every copy with no checkpoint); every wait and
 * request of the session fails with it, the message giving the scheduler's
 * reason. An added value: PS_ABI_VERSION is unchanged. */
#define PS_REASON_JOB_FAILED 4

/* Claim results (ps_claim.result). */
#define PS_CLAIM_WAIT 1
#define PS_CLAIM_ASSIGNED 2
#define PS_CLAIM_ALL_DONE 3

/* Shard protocol results (ps_next_shard.result). */
#define PS_SHARD_TRAIN 1
#define PS_SHARD_ALL_DONE 2
#define PS_SHARD_STOPPED 3

typedef struct ps_config ps_config;
typedef struct ps_session ps_session;
typedef struct ps_future ps_future;
typedef struct ps_allreduce ps_allreduce;

/* Where a data shard stands: the next batch to train. */
typedef struct ps_position {
  uint32_t shard;
  uint64_t epoch;
  uint64_t batch;
  int32_t done; /* 1: every epoch of the shard is trained */
} ps_position;

/* A job config. Strings point into the ps_config they came from and are
 * valid until it is freed. */
typedef struct ps_job_info {
  const char* name;
  const char* mode; /* ASYNC, BSP or SSP */
  uint32_t staleness;
  uint32_t num_workers;
  uint32_t num_servers;
  int32_t prefetch;
  /* data_plane.gradients.nonfinite CLIP: non-finite gradients are sent for
   * the servers to clip instead of being refused by the worker. */
  int32_t clips_nonfinite;
  uint32_t num_tables;
  /* training block */
  uint64_t batch_size;
  uint64_t epochs;
  int32_t shard_by_batch;
  uint64_t max_steps;
  const char* export_path;
  const char* checkpoint_dir;
} ps_job_info;

/* The job's data.synthetic_ctr: examples per split and fields. */
typedef struct ps_synthetic_info {
  uint64_t num_train;
  uint64_t num_test;
  uint32_t num_numeric;
  uint32_t num_categorical;
} ps_synthetic_info;

typedef struct ps_table_info {
  const char* name;
  uint32_t id;
  int32_t sparse;
  uint32_t dim;               /* sparse: row width; dense: 1 */
  uint64_t size;              /* dense: elements; sparse: 0 */
  const char* optimizer;      /* sgd, adagrad, momentum, adam, ftrl, none */
  const char* optimizer_json; /* its settings, as protobuf's JSON */
  /* dense.sync ALLREDUCE: every training worker keeps a replica and the
   * workers average their gradients by a ring all-reduce (ps_allreduce_*);
   * 0 for sparse tables and dense tables on the servers. */
  int32_t allreduce;
  /* The id of the all-reduced table whose optimizer state this dense table
   * holds on the servers ("<table>.allreduce_state", added by the config
   * loader for optimizers with state; not a model parameter); -1: none. */
  int32_t allreduce_state_of;
} ps_table_info;

typedef struct ps_session_details {
  uint32_t rank;
  uint64_t node_id;
  int32_t observer;
  int32_t restored_start;
  uint64_t start_clock;
  int32_t has_position;
  ps_position position;
} ps_session_details;

typedef struct ps_claim {
  int32_t result; /* PS_CLAIM_* */
  ps_position position;
  uint64_t start_clock;
} ps_claim;

/* What the shard protocol answered (ps_future_next_shard). */
typedef struct ps_next_shard {
  int32_t result;       /* PS_SHARD_* */
  int32_t has_position; /* 0: no position (see ps_session_next_shard) */
  ps_position position;
} ps_next_shard;

/* One table on one server (proto TableStats). */
typedef struct ps_table_stats {
  uint32_t server;
  uint32_t table_id;
  int32_t sparse;
  uint64_t rows;
  uint64_t bytes;
  uint64_t memory_budget_bytes;
  uint64_t keys_pushed;
  uint64_t keys_pulled;
  uint64_t admissions;
  uint64_t pushes_filtered;
  uint64_t evictions_ttl;
  uint64_t evictions_budget;
  uint64_t pushes_refused;
  uint64_t keys_dropped;
  uint64_t backup_rows;
  /* A sparse table's disk tier (proto TableStats); 0 without one. */
  uint64_t cold_rows;
  uint64_t disk_bytes;
  uint64_t demotions;
  uint64_t promotions;
  uint64_t cold_reads;
  uint64_t cold_misses;
  uint64_t bloom_useful;
  uint64_t disk_reads;
  uint64_t cold_read_micros;
  uint64_t disk_bytes_written;
  uint64_t cold_rows_dropped;
  uint64_t tier_errors;
  uint64_t tier_memory_bytes;
  uint64_t rows_read_ahead;
  uint64_t staged_rows;
} ps_table_stats;

/* The job's progress as the scheduler computes it from every shard's
 * position (proto JobProgress). */
typedef struct ps_job_progress {
  double progress; /* steps done / steps to do, in [0, 1] */
  int32_t has_eta; /* 0: eta_s unknown (no pace measured yet) */
  double eta_s;    /* seconds left at the job's recent pace */
  uint64_t steps_done;
  uint64_t steps_total;
  int32_t total_known; /* 0: steps_total is an estimate */
  double steps_per_second;
  double examples_per_second;
  uint64_t examples; /* examples trained, as the workers reported them */
  double elapsed_s;  /* seconds since the job started running */
} ps_job_progress;

int32_t ps_abi_version(void);
/* The message of this thread's last failed call ("" if none). Valid until
 * this thread's next call into the library. */
const char* ps_last_error(void);
/* PS_REASON_* of this thread's last failed call. */
int32_t ps_last_error_reason(void);
/* trace|debug|info|warn|error|off; INVALID_ARGUMENT otherwise. */
int32_t ps_set_log_level(const char* level);

/* ---- job configs (no session) ---------------------------------------- */

/* The key the C++ readers give categorical field `field` with value
 * `value` (worker/data/keys.h CriteoKey), for n pairs. */
void ps_hash_keys(uint32_t field, const uint64_t* values, size_t n,
                  uint64_t* out);

/* Loads and validates a job config file; num_servers / num_workers: 0
 * keeps the file's. Free with ps_config_free. A config is read-only and may
 * be used from any thread. */
int32_t ps_config_load(const char* path, int64_t num_servers,
                       int64_t num_workers, ps_config** out);
void ps_config_free(ps_config* c);
int32_t ps_config_job(const ps_config* c, ps_job_info* out);
/* Table `index` in [0, num_tables), in the config's order. */
int32_t ps_config_table(const ps_config* c, uint32_t index, ps_table_info* out);

/* The servers' initial values of table `table` for n keys (sparse: dim
 * floats each, row-major) or, for a dense table, the elements
 * [first, first + n) (keys may then be NULL). Deterministic: the same
 * values every server creates. */
int32_t ps_initial_values(const ps_config* c, const char* table,
                          const uint64_t* keys, size_t n, uint64_t first,
                          float* out, size_t out_len);

/* The sizes of the job's data.synthetic_ctr (INVALID_ARGUMENT without
 * one). Builds its generator, once per config. */
int32_t ps_config_synthetic_ctr(const ps_config* c, ps_synthetic_info* out);

/* Synthetic CTR data of the job (data.synthetic_ctr): examples [begin,
 * begin + count) of split 0 (train) or 1 (test). numeric: count *
 * num_numeric floats; keys: count * num_categorical; labels: count;
 * true_logits (may be NULL): count. Sizes are checked. The generator is
 * built once per config. */
int32_t ps_synthetic_ctr(const ps_config* c, int32_t split, uint64_t begin,
                         uint64_t count, float* numeric, size_t numeric_len,
                         uint64_t* keys, size_t keys_len, float* labels,
                         float* true_logits);

/* ---- session --------------------------------------------------------- */

/* Starts joining the job of `config` (register, wait for every server,
 * data-plane client) on a thread of its own; the future's session is taken
 * with ps_future_take_session once it is done. flags: PS_TRAINS_SHARDS for
 * a training worker (its shard is resumed by another if it dies),
 * PS_OBSERVER for an observer (no worker rank, no clock, never holds
 * BSP/SSP back; it only reads: pushes and the lifecycle calls fail with
 * FAILED_PRECONDITION). stop_check_s: the longest any wait of the session
 * blocks before looking for a stop (ps_session_request_stop); 0: 2 s.
 * startup_timeout_s 0: the config's. */
int32_t ps_session_start(const ps_config* config, const char* scheduler,
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
int32_t ps_session_info(ps_session* s, ps_session_details* out);
/* The session's job config (cluster sizes as the session uses them),
 * owned by the session: valid until ps_session_free. */
const ps_config* ps_session_config(ps_session* s);
uint64_t ps_session_clock(ps_session* s);
/* For timeout messages under BSP/SSP: the live workers this one waits
 * for, e.g. "worker rank 1 (clock 3, last heard 20 ms ago)"; "" if none.
 * Free with ps_free_string. */
char* ps_session_slow_workers(ps_session* s);
void ps_free_string(char* s);
/* The clock of the newest committed checkpoint of the job (0: none). */
uint64_t ps_session_last_checkpoint(ps_session* s);
/* 1 when a stop was requested (ps_session_request_stop, psctl drain). */
int32_t ps_session_stop_requested(ps_session* s);
/* 0 while the session can go on; else the status that ended it (message in
 * ps_last_error(), reason PS_REASON_DROPPED or
 * PS_REASON_SCHEDULER_UNREACHABLE). */
int32_t ps_session_ended(ps_session* s);
void ps_session_request_stop(ps_session* s);
/* Ends a step (clock + 1 on every live server, after this thread's
 * pushes); once acknowledged `next` (NULL: none) is reported to the
 * scheduler. */
int32_t ps_session_end_step(ps_session* s, const ps_position* next,
                            ps_future** out);
/* Barrier `name` of every live worker, bounded by timeout_s
 * (PS_NO_TIMEOUT: none). The ranks that arrived: ps_future_ranks. */
int32_t ps_session_barrier(ps_session* s, const char* name, double timeout_s,
                           ps_future** out);
/* One claim round (see WorkerSession::Claim), reporting `finished` (NULL:
 * none) done. The answer: ps_future_claim. */
int32_t ps_session_claim(ps_session* s, const ps_position* finished,
                         ps_future** out);
int32_t ps_session_restart(ps_session* s, uint64_t clock);
/* Finish (timeout_s: PS_NO_TIMEOUT for none): ps_future_finish answers 1
 * on the worker that evaluates for the job, 0 on the others (returned once
 * the evaluator is done); ps_future_ranks the ranks that finished. */
int32_t ps_session_finish(ps_session* s, double timeout_s, ps_future** out);
int32_t ps_session_evaluation_done(ps_session* s);
/* A consistent checkpoint: ps_future_checkpoint answers its clock. */
int32_t ps_session_checkpoint(ps_session* s, ps_future** out);
/* position: NULL for none. */
int32_t ps_session_leave(ps_session* s, int32_t finished,
                         const ps_position* position);

/* ---- the job's progress and curves (the scheduler's /status) ----------- */

/* The job's progress, from one status RPC to the scheduler (bounded by the
 * control plane's RPC timeout, 5 s; UNAVAILABLE or DEADLINE_EXCEEDED while
 * the scheduler is away). A scheduler that does not compute progress
 * answers zeros. Observers too. May be called from any thread. */
int32_t ps_session_job_progress(ps_session* s, ps_job_progress* out);
/* A new value of metric `name` (1 to 64 characters of [A-Za-z0-9_./-]) at
 * this worker's step (its clock; after finish, the last step it trained),
 * sent with the next heartbeats: the scheduler shows it as the curve
 * "metric/<name>". INVALID_ARGUMENT for a bad name or a non-finite value,
 * RESOURCE_EXHAUSTED for a 33rd name, FAILED_PRECONDITION for an observer
 * (it sends no heartbeats). Returns at once; any thread. */
int32_t ps_session_report_metric(ps_session* s, const char* name, double value);
/* What the step being ended trained, for the job's loss and examples/s
 * curves: `examples` examples, whose per-example losses sum to `loss_sum`
 * over `loss_examples` of them (a non-finite loss_sum: the loss is left
 * out). Counters add up; sent with the next heartbeats. Call once per step.
 * FAILED_PRECONDITION for an observer. Returns at once. */
int32_t ps_session_report_trained(ps_session* s, uint64_t examples,
                                  double loss_sum, uint64_t loss_examples);
/* Batches in an epoch of the shard being trained (0: unknown), so the
 * scheduler knows the shard's size (progress, ETA). FAILED_PRECONDITION
 * for an observer. Returns at once. */
int32_t ps_session_set_shard_batches(ps_session* s, uint64_t batches);

/* ---- the shard protocol (worker/shard_cursor.h) ------------------------ */

/* The training loop's shards, for Session.batches: reports where the shard
 * of the previous call ended (`ended`: NULL on the first call; done, or
 * stopped before its end at the next untrained batch) and asks for the
 * next one, on a thread of its own (stopped when the future is freed). The
 * first call meets the other workers at the start barrier of a fresh or
 * restored job; then this worker's own shard, then claims: WAIT is asked
 * again (paced), shard numbers are checked against the job (INVALID_ARGUMENT
 * naming a bad one), a claimed shard's clock is restarted. The answer,
 * ps_future_next_shard: PS_SHARD_TRAIN: the shard to train, from
 * `position`; PS_SHARD_STOPPED (a stop request): the position to hand back
 * with ps_session_leave (has_position 0: none); PS_SHARD_ALL_DONE: every
 * shard is done. */
int32_t ps_session_next_shard(ps_session* s, const ps_position* ended,
                              ps_future** out);

/* ---- data plane ------------------------------------------------------ */

/* Sparse tables: grads holds n * dim floats, out room for as many. */
int32_t ps_pull(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                float* out, size_t out_len, ps_future** f);
int32_t ps_push(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                const float* grads, size_t grads_len, ps_future** f);
int32_t ps_push_pull(ps_session* s, uint32_t table, const uint64_t* keys,
                     size_t n, const float* grads, size_t grads_len, float* out,
                     size_t out_len, ps_future** f);
/* A hint: these keys will be pulled or pushed soon (KVClient::Prefetch). A
 * server keeping the table's cold rows on disk starts reading them into
 * RAM; no value changes. The keys are copied before the call returns; the
 * future completes once the servers answered (their reads go on). */
int32_t ps_prefetch(ps_session* s, uint32_t table, const uint64_t* keys,
                    size_t n, ps_future** f);
/* Dense tables: elements [begin, begin + n). */
int32_t ps_pull_dense(ps_session* s, uint32_t table, uint64_t begin, size_t n,
                      float* out, ps_future** f);
int32_t ps_push_dense(ps_session* s, uint32_t table, uint64_t begin,
                      const float* grads, size_t n, ps_future** f);
int32_t ps_assign_dense(ps_session* s, uint32_t table, uint64_t begin,
                        const float* values, size_t n, ps_future** f);
/* Every row of sparse table `table` (ps_future_scan_size / _copy). */
int32_t ps_scan(ps_session* s, uint32_t table, ps_future** f);
/* Statistics of every table on every live server (ps_future_stats). */
int32_t ps_stats(ps_session* s, ps_future** f);

/* ---- dense tables by ring all-reduce (dense.sync ALLREDUCE) ------------
 *
 * A worker's replica of its job's all-reduced dense tables
 * (worker/dense_ring.h): each step averages the gradients of the workers in
 * the ring (gloo's ring all-reduce over TCP, rendezvous through the
 * scheduler) and applies the tables' optimizer to the replica, with the
 * servers' update rules and learning-rate schedule, so P workers at batch b
 * train as BSP on the servers does. A worker has one ring: the tables of one
 * replica are concatenated (in the order given) and all-reduced together,
 * so they must share one optimizer config. The servers still hold the
 * tables (their home for export and checkpoints): write the replica there
 * with ps_assign_dense.
 *
 * Thread safety: the calls of one replica serialise on a lock of its own;
 * call them from the thread that ends the steps. Step, join and leave block
 * (bounded by allreduce.timeout_ms and allreduce.form_timeout_ms) and
 * cannot be interrupted. A replica holds a reference to its session: free
 * it before ps_session_free (which otherwise leaves the job only once the
 * replica is freed). In a forked child every call fails with
 * FAILED_PRECONDITION. */

/* Where a replica stands (ps_allreduce_info). Sizes and counts are elements
 * (floats). */
typedef struct ps_ring_info {
  uint64_t size;       /* the tables' elements, summed */
  uint32_t state_size; /* optimizer state floats per element */
  uint64_t step;       /* steps applied (the learning-rate schedule's step) */
  uint32_t ring_size;  /* members of the ring it is in; 0: not in one */
  uint64_t generation; /* the ring's generation; 0: not in one */
  uint64_t reforms;    /* collectives that failed and re-formed the ring */
  /* The data-plane clock of the member whose state the last formation
   * broadcast (0: none yet). */
  uint64_t peer_clock;
  int32_t connected; /* 1: in a ring that no one asked to form again */
} ps_ring_info;

/* Creates the replica of dense tables `tables` (num_tables ids, each
 * ALLREDUCE in the session's job, no id twice, one optimizer config) for a
 * training session: INVALID_ARGUMENT naming the table otherwise,
 * FAILED_PRECONDITION for an observer. `initial`: initial_len floats, the
 * tables' values concatenated; NULL: the tables' initializers (the values a
 * fresh job's servers hold, common/initializer.h). `step`: steps already
 * applied (the session's clock). `host`: the address the other workers
 * reach this one's ring connections at (NULL or "": 127.0.0.1). The
 * optimizer state starts fresh. Joins no ring yet (ps_allreduce_join, or
 * the first step). */
int32_t ps_allreduce_create(ps_session* s, const uint32_t* tables,
                            size_t num_tables, const float* initial,
                            size_t initial_len, uint64_t step, const char* host,
                            ps_allreduce** out);
/* Leaves the ring (the others re-form without it) and frees the replica. */
void ps_allreduce_free(ps_allreduce* r);
/* Joins the ring now, unless connected, and receives the state of its most
 * advanced member. min_members: workers that start training together (a
 * fresh or restored job, after a barrier) pass their number, so the first
 * ring holds them all (capped at the job's live workers). 0: a worker
 * joining a ring that is training (a replacement, a worker back from a
 * shard's end): its clock reads finished while it waits (so BSP and SSP
 * members never wait for it while it waits for them) and then resumes at
 * the members' clock (ps_ring_info.peer_clock) or its own, when later.
 * DEADLINE_EXCEEDED when no ring formed within allreduce.form_timeout_ms;
 * NOT_FOUND when the scheduler no longer counts this worker. */
int32_t ps_allreduce_join(ps_allreduce* r, uint32_t min_members);
/* One step: averages `grads` (n == size finite floats) over the ring and
 * applies the optimizer to the replica, re-forming the ring first when
 * needed (a worker that was behind takes the state of the most advanced
 * member instead of applying its gradient). Blocks until done. A worker
 * joining a ring that trains calls ps_allreduce_join(r, 0) first: a step
 * outside a ring waits for one to form with every live member, who under
 * BSP and SSP may be waiting for this worker's clock. Errors as
 * ps_allreduce_join; INVALID_ARGUMENT for a size mismatch. */
int32_t ps_allreduce_step(ps_allreduce* r, const float* grads, size_t n);
/* Ends a step of a training session whose all-reduced tables are in this
 * replica: ps_session_end_step(s, next) and, once it is issued, the
 * all-reduce of `grads` (as ps_allreduce_step): the clock moves on first, so
 * that under BSP and SSP a worker waiting for a ring to re-form never holds
 * back the pulls of the members it waits for. The last step before a
 * checkpoint's cut (the view's checkpoint clock) is all-reduced first, and
 * the ring's first member writes the replica to the servers (as
 * ps_allreduce_write) before the step ends, so the checkpoint holds it.
 * *out: the future of the step's end; set even when the all-reduce then
 * fails, NULL when the step was not ended. */
int32_t ps_allreduce_end_step(ps_allreduce* r, const float* grads, size_t n,
                              const ps_position* next, ps_future** out);
/* Writes the replica's values to the servers' tables and its optimizer
 * state to their companion tables ("<table>.allreduce_state", which the
 * config loader adds for optimizers with state), and waits: the servers'
 * copy for export, evaluation and checkpoints. */
int32_t ps_allreduce_write(ps_allreduce* r);
/* Replaces the replica's values by the servers' copy, and its optimizer
 * state too when `state` is non-zero (a worker resuming a job from a
 * checkpoint); the step is kept. */
int32_t ps_allreduce_read(ps_allreduce* r, int32_t state);
/* Leaves the ring (no training work for now; the next step joins again). */
int32_t ps_allreduce_leave(ps_allreduce* r);
/* Copies elements [begin, begin + n) of the replica's values to `out`. */
int32_t ps_allreduce_values(ps_allreduce* r, uint64_t begin, float* out,
                            size_t n);
/* Copies the optimizer state (size * state_size floats, state_size per
 * element, interleaved as common/optimizer.h lays it out); n must match. */
int32_t ps_allreduce_state(ps_allreduce* r, float* out, size_t n);
/* Replaces the replica: values (size floats), state (size * state_size
 * floats; NULL keeps the current state) and the steps applied. A later
 * formation still takes the most advanced member's state. */
int32_t ps_allreduce_reset(ps_allreduce* r, const float* values, size_t n,
                           const float* state, size_t state_len, uint64_t step);
int32_t ps_allreduce_info(ps_allreduce* r, ps_ring_info* out);

/* ---- futures ----------------------------------------------------------- */

/* Waits at most timeout_s (0: just look; PS_NO_TIMEOUT: until done):
 * PS_PENDING if not done, else the operation's status code (its message in
 * ps_last_error(), its reason in ps_last_error_reason()). */
int32_t ps_future_wait(ps_future* f, double timeout_s);
int32_t ps_future_done(ps_future* f);
/* Pulls: the slowest live worker's clock when the servers answered. */
uint64_t ps_future_min_clock(ps_future* f);
/* The results of a successful operation, each from the operation that
 * makes it: FAILED_PRECONDITION while it runs or after it failed,
 * INVALID_ARGUMENT from a future of another kind. */
int32_t ps_future_claim(ps_future* f, ps_claim* out);
int32_t ps_future_next_shard(ps_future* f, ps_next_shard* out);
/* Barrier: the ranks that arrived; finish: the ranks that finished. *n
 * receives how many there are; at most `capacity` are written to `out`. */
int32_t ps_future_ranks(ps_future* f, uint32_t* out, size_t capacity,
                        size_t* n);
int32_t ps_future_finish(ps_future* f, int32_t* evaluator);
int32_t ps_future_checkpoint(ps_future* f, uint64_t* clock);
/* Stats: *n receives how many entries there are; at most `capacity` are
 * written to `out`. */
int32_t ps_future_stats(ps_future* f, ps_table_stats* out, size_t capacity,
                        size_t* n);
/* After a successful ps_session_start: takes the session (once). */
ps_session* ps_future_take_session(ps_future* f);
/* After a successful ps_scan: the number of rows and the row width, then
 * a copy of keys (rows) and values (rows * dim). */
int32_t ps_future_scan_size(ps_future* f, uint64_t* rows, uint32_t* dim);
int32_t ps_future_scan_copy(ps_future* f, uint64_t* keys, float* values);
/* Frees the handle. A lifecycle operation still running is asked to stop
 * first and waited for (a checkpoint is waited for); a data-plane request
 * still in flight keeps running (its output buffer must stay valid until
 * it completes or the session is freed). */
void ps_future_free(ps_future* f);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PS_PYTHON_NATIVE_PS_C_H_ */
