/* A C client of memtrail's C ABI (issue 13), run by tests/ffi/ffi_c.rs:
 * `client self` tracks itself and checks a region's exact counts, `client
 * spawn PROFILE` tracks a child, `client errors` checks every error path,
 * `client fork PROFILE` calls a session from a child of fork, `client
 * retry PROFILE` writes a profile again after a failed write, `client
 * reaped PROFILE` waits for a command it reaped itself (issue 28), `client
 * newer` passes options of a newer header, `client stale` uses a freed
 * handle after a new session started, `client
 * wait-snapshot` takes snapshots while another thread waits, `client
 * teardown` calls in a thread's pthread-key destructor (issue 27).
 * Built with -O0 -fno-builtin so that every malloc and free is a call. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memtrail.h"

#define CHECK(cond)                                                           \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "%s:%d: failed: %s (last error: %s)\n", \
				__FILE__, __LINE__, #cond, memtrail_last_error()); \
			return 1;                                             \
		}                                                             \
	} while (0)

static int track_self(void)
{
	memtrail_session *s = NULL;
	memtrail_region_counts rc;
	memtrail_totals before, after;
	void *a, *b, *c;

	CHECK(memtrail_track_self(NULL, &s) == MEMTRAIL_OK);
	memset(&before, 0, sizeof(before));
	before.size = sizeof(before);
	CHECK(memtrail_snapshot(s, &before) == MEMTRAIL_OK);

	memset(&rc, 0, sizeof(rc));
	rc.size = sizeof(rc);
	CHECK(memtrail_region_begin(s, "three mallocs, one free") == MEMTRAIL_OK);
	a = malloc(100);
	b = malloc(200);
	c = malloc(300);
	free(b);
	CHECK(memtrail_region_end(s, &rc) == MEMTRAIL_OK);
	CHECK(rc.allocations == 3);
	CHECK(rc.frees == 1);
	CHECK(rc.allocated_bytes == 600);
	CHECK(rc.freed_bytes == 200);
	CHECK(rc.peak_live_bytes == 600);
	CHECK(rc.live_allocations == 2);
	CHECK(rc.live_bytes == 400);
	free(a);
	free(c);

	memset(&after, 0, sizeof(after));
	after.size = sizeof(after);
	CHECK(memtrail_snapshot(s, &after) == MEMTRAIL_OK);
	CHECK(after.allocations - before.allocations == 3);
	CHECK(after.frees - before.frees == 3);

	/* A caller built with a newer, larger struct: the library writes its
	 * own part and leaves the rest as it was. */
	{
		struct {
			memtrail_region_counts rc;
			uint64_t newer;
		} big;

		memset(&big, 0xff, sizeof(big));
		big.rc.size = sizeof(big);
		CHECK(memtrail_region_begin(s, "newer struct") == MEMTRAIL_OK);
		CHECK(memtrail_region_end(s, &big.rc) == MEMTRAIL_OK);
		CHECK(big.rc.size == sizeof(big));
		CHECK(big.rc.allocations == 0 && big.rc.live_bytes == 0);
		CHECK(big.newer == UINT64_MAX);
	}

	CHECK(memtrail_wait(s, NULL) == MEMTRAIL_E_STATE);
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	return 0;
}

/* Runs `sh -c "exit 3"` with per-process probes and per-CPU events rings
 * and writes its profile to PROFILE. */
static int spawn(const char *profile)
{
	char *argv[] = { "/bin/sh", "-c", "exit 3", NULL };
	memtrail_options opts;
	memtrail_session *s = NULL;
	int code = 0;

	CHECK(memtrail_options_init(&opts, sizeof(opts)) == MEMTRAIL_OK);
	opts.probes = MEMTRAIL_PROBES_PER_PROCESS;
	opts.event_rings = MEMTRAIL_EVENT_RINGS_PER_CPU;
	CHECK(memtrail_spawn(&opts, (const char *const *)argv, &s) == MEMTRAIL_OK);
	CHECK(memtrail_wait(s, &code) == MEMTRAIL_OK);
	CHECK(code == 3);
	CHECK(memtrail_write_profile(s, profile) == MEMTRAIL_OK);
	CHECK(access(profile, R_OK) == 0);
	/* Finished: the profile is kept and can be written again, the
	 * session's other calls are refused. */
	{
		char again[4096];
		memtrail_totals t;

		CHECK(snprintf(again, sizeof(again), "%s.again", profile) < (int)sizeof(again));
		CHECK(memtrail_write_profile(s, again) == MEMTRAIL_OK);
		memset(&t, 0, sizeof(t));
		t.size = sizeof(t);
		CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_E_STATE);
		CHECK(memtrail_wait(s, NULL) == MEMTRAIL_E_STATE);
	}
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	return 0;
}

/* In a child of fork, every call on the parent's session. */
static int child_calls(memtrail_session *s, const char *profile)
{
	memtrail_totals t;
	memtrail_region_counts rc;

	memset(&t, 0, sizeof(t));
	t.size = sizeof(t);
	memset(&rc, 0, sizeof(rc));
	rc.size = sizeof(rc);
	CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_E_HANDLE);
	CHECK(strstr(memtrail_last_error(), "fork") != NULL);
	CHECK(memtrail_region_begin(s, "child") == MEMTRAIL_E_HANDLE);
	CHECK(memtrail_region_end(s, &rc) == MEMTRAIL_E_HANDLE);
	CHECK(memtrail_wait(s, NULL) == MEMTRAIL_E_HANDLE);
	CHECK(memtrail_write_profile(s, profile) == MEMTRAIL_E_HANDLE);
	CHECK(access(profile, F_OK) != 0);
	CHECK(memtrail_session_free(s) == MEMTRAIL_E_HANDLE);
	/* Not freed by that: still the parent's. */
	CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_E_HANDLE);
	CHECK(strstr(memtrail_last_error(), "fork") != NULL);
	return 0;
}

/* Tracks itself, forks, and has the child call into the session (each
 * call refused, none hanging: an alarm kills a child that hangs); then
 * checks that its own session works as before: a region's exact counts. */
static int fork_child(const char *profile)
{
	memtrail_session *s = NULL;
	memtrail_region_counts rc;
	memtrail_totals t;
	void *a, *b;
	pid_t child;
	int status;

	CHECK(memtrail_track_self(NULL, &s) == MEMTRAIL_OK);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		alarm(60);
		_exit(child_calls(s, profile));
	}
	CHECK(waitpid(child, &status, 0) == child);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	memset(&rc, 0, sizeof(rc));
	rc.size = sizeof(rc);
	CHECK(memtrail_region_begin(s, "after fork") == MEMTRAIL_OK);
	a = malloc(111);
	b = malloc(222);
	free(a);
	CHECK(memtrail_region_end(s, &rc) == MEMTRAIL_OK);
	CHECK(rc.allocations == 2 && rc.frees == 1 && rc.allocated_bytes == 333);
	free(b);
	memset(&t, 0, sizeof(t));
	t.size = sizeof(t);
	CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_OK);
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	return 0;
}

/* Runs `sh -c "exit 3"`, writes its profile onto /dev/full (which fails),
 * then writes it again to PROFILE. */
static int retry(const char *profile)
{
	char *argv[] = { "/bin/sh", "-c", "exit 3", NULL };
	memtrail_session *s = NULL;
	int code = 0;

	CHECK(memtrail_spawn(NULL, (const char *const *)argv, &s) == MEMTRAIL_OK);
	CHECK(memtrail_wait(s, &code) == MEMTRAIL_OK);
	CHECK(code == 3);
	CHECK(memtrail_write_profile(s, "/dev/full") == MEMTRAIL_E_OUTPUT);
	CHECK(strlen(memtrail_last_error()) > 0);
	CHECK(memtrail_write_profile(s, "/nonexistent-dir/profile.json") == MEMTRAIL_E_OUTPUT);
	CHECK(memtrail_write_profile(s, profile) == MEMTRAIL_OK);
	CHECK(access(profile, R_OK) == 0);
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	return 0;
}

/* Runs a shell that writes its pid into a pipe and exits 3, reaps it with
 * waitpid itself, then asks memtrail_wait: MEMTRAIL_E_STATE, saying so;
 * the profile is still written to PROFILE. */
static int reaped(const char *profile)
{
	char script[64];
	char *argv[] = { "/bin/sh", "-c", script, NULL };
	memtrail_session *s = NULL;
	char buf[32] = { 0 };
	size_t got = 0;
	int code = 77, status, fds[2];
	pid_t pid;

	CHECK(pipe(fds) == 0);
	CHECK(snprintf(script, sizeof(script), "echo $$ >&%d; exit 3", fds[1]) <
	      (int)sizeof(script));
	CHECK(memtrail_spawn(NULL, (const char *const *)argv, &s) == MEMTRAIL_OK);
	close(fds[1]);
	while (got < sizeof(buf) - 1 && !strchr(buf, '\n')) {
		ssize_t n = read(fds[0], buf + got, sizeof(buf) - 1 - got);

		CHECK(n > 0);
		got += (size_t)n;
	}
	pid = (pid_t)atoi(buf);
	CHECK(pid > 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 3);
	CHECK(memtrail_wait(s, &code) == MEMTRAIL_E_STATE);
	CHECK(strstr(memtrail_last_error(), "reaped") != NULL);
	CHECK(code == 77);
	CHECK(memtrail_write_profile(s, profile) == MEMTRAIL_OK);
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	return 0;
}

/* Renders PROFILE as a text report (by count, top 3) into TEXT and as a
 * pprof into PPROF; then every error path of memtrail_write_report. */
static int report(const char *profile, const char *text, const char *pprof)
{
	CHECK(memtrail_write_report(profile, text, MEMTRAIL_FORMAT_TEXT,
				    MEMTRAIL_METRIC_COUNT, 3) == MEMTRAIL_OK);
	CHECK(memtrail_write_report(profile, pprof, MEMTRAIL_FORMAT_PPROF,
				    MEMTRAIL_METRIC_BYTES, 0) == MEMTRAIL_OK);
	CHECK(memtrail_write_report(NULL, text, 0, 0, 0) == MEMTRAIL_E_NULL);
	CHECK(memtrail_write_report(profile, NULL, 0, 0, 0) == MEMTRAIL_E_NULL);
	CHECK(memtrail_write_report(profile, text, 99, 0, 0) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_write_report(profile, text, 0, 99, 0) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_write_report("/nonexistent-dir/p.json", text, 0, 0, 0) ==
	      MEMTRAIL_E_NOT_FOUND);
	/* A file that is not a profile: the report is not written. */
	CHECK(memtrail_write_report("/proc/self/stat", "/nonexistent-dir/r", 0, 0,
				    0) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_write_report(profile, "/nonexistent-dir/report.txt", 0, 0,
				    0) == MEMTRAIL_E_OUTPUT);
	CHECK(strlen(memtrail_last_error()) > 0);
	/* Never over the profile it reads (issue 28). */
	CHECK(memtrail_write_report(profile, profile, 0, 0, 0) ==
	      MEMTRAIL_E_OUTPUT);
	CHECK(strstr(memtrail_last_error(), "being read") != NULL);
	return 0;
}

/* Options from a caller built against a newer, larger header (8 bytes
 * more): init keeps its size, zeroes the fields this library does not know
 * and writes nothing past the size; a session takes them while they are 0,
 * and refuses them once one is set (issue 27: it was ignored). */
static int newer(void)
{
	char *missing[] = { "memtrail-no-such-command", NULL };
	memtrail_session *s = NULL;
	union {
		memtrail_options opts;
		unsigned char bytes[sizeof(memtrail_options) + 16];
	} old;
	size_t i;

	memset(&old, 0xaa, sizeof(old));
	CHECK(memtrail_options_init(&old.opts, sizeof(memtrail_options) + 8) ==
	      MEMTRAIL_OK);
	CHECK(old.opts.size == sizeof(memtrail_options) + 8);
	for (i = sizeof(memtrail_options); i < sizeof(memtrail_options) + 8; i++)
		CHECK(old.bytes[i] == 0);
	for (i = sizeof(memtrail_options) + 8; i < sizeof(old.bytes); i++)
		CHECK(old.bytes[i] == 0xaa);
	CHECK(memtrail_spawn(&old.opts, (const char *const *)missing, &s) ==
	      MEMTRAIL_E_NOT_FOUND);
	old.bytes[sizeof(memtrail_options) + 5] = 1;
	CHECK(memtrail_spawn(&old.opts, (const char *const *)missing, &s) ==
	      MEMTRAIL_E_UNKNOWN_FIELD);
	CHECK(strstr(memtrail_last_error(), "newer header") != NULL);
	CHECK(memtrail_track_self(&old.opts, &s) == MEMTRAIL_E_UNKNOWN_FIELD);
	CHECK(s == NULL);
	/* The same struct built by hand: zeroed, then its size set. */
	memset(&old, 0, sizeof(old));
	CHECK(memtrail_options_default(&old.opts) == MEMTRAIL_OK);
	old.opts.size = sizeof(old.bytes);
	CHECK(memtrail_spawn(&old.opts, (const char *const *)missing, &s) ==
	      MEMTRAIL_E_NOT_FOUND);
	old.bytes[sizeof(old.bytes) - 1] = 0x80;
	CHECK(memtrail_spawn(&old.opts, (const char *const *)missing, &s) ==
	      MEMTRAIL_E_UNKNOWN_FIELD);
	return 0;
}

static int errors(void)
{
	memtrail_options opts;
	memtrail_session *s = NULL;
	memtrail_region_counts rc;
	memtrail_totals t;
	char *missing[] = { "memtrail-no-such-command", NULL };
	char *empty[] = { NULL };
	int not_a_session = 0;

	CHECK(memtrail_options_default(NULL) == MEMTRAIL_E_NULL);
	CHECK(memtrail_options_default(&opts) == MEMTRAIL_OK);
	CHECK(opts.size == sizeof(opts));
	CHECK(memtrail_options_init(NULL, sizeof(opts)) == MEMTRAIL_E_NULL);
	CHECK(memtrail_options_init(&opts, 8) == MEMTRAIL_E_INVALID);

	/* A caller built against the first header: its struct ends before
	 * `probes`. init writes nothing past it, and a session takes it with
	 * the defaults for the rest (spawning a missing command fails only
	 * once the options are read). */
	{
		union {
			memtrail_options opts;
			unsigned char bytes[sizeof(memtrail_options) + 16];
		} old;
		size_t first = offsetof(memtrail_options, probes), i;

		memset(&old, 0xaa, sizeof(old));
		CHECK(memtrail_options_init(&old.opts, first) == MEMTRAIL_OK);
		CHECK(old.opts.size == first);
		for (i = first; i < sizeof(old.bytes); i++)
			CHECK(old.bytes[i] == 0xaa);
		CHECK(memtrail_spawn(&old.opts, (const char *const *)missing, &s) ==
		      MEMTRAIL_E_NOT_FOUND);
	}
	CHECK(memtrail_options_init(&opts, sizeof(opts)) == MEMTRAIL_OK);
	opts.probes = 3;
	CHECK(memtrail_spawn(&opts, (const char *const *)missing, &s) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_options_init(&opts, sizeof(opts)) == MEMTRAIL_OK);
	opts.event_rings = 3;
	CHECK(memtrail_spawn(&opts, (const char *const *)missing, &s) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_track_self(&opts, NULL) == MEMTRAIL_E_NULL);

	opts.size = 0;
	CHECK(memtrail_track_self(&opts, &s) == MEMTRAIL_E_INVALID);
	CHECK(strlen(memtrail_last_error()) > 0);
	CHECK(memtrail_options_default(&opts) == MEMTRAIL_OK);
	opts.ring_size = 3;
	CHECK(memtrail_track_self(&opts, &s) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_options_default(&opts) == MEMTRAIL_OK);
	opts.watermark_percent = 100;
	CHECK(memtrail_track_self(&opts, &s) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_options_default(&opts) == MEMTRAIL_OK);
	opts.stack_depth = 1000;
	CHECK(memtrail_track_self(&opts, &s) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_options_default(&opts) == MEMTRAIL_OK);
	opts.pressure_timeout_ns = 1000; /* below 1 ms */
	CHECK(memtrail_spawn(&opts, (const char *const *)missing, &s) == MEMTRAIL_E_INVALID);
	opts.pressure_timeout_ns = UINT64_MAX; /* a process cannot pause itself */
	CHECK(memtrail_track_self(&opts, &s) == MEMTRAIL_E_INVALID);
	CHECK(s == NULL);

	CHECK(memtrail_spawn(NULL, NULL, &s) == MEMTRAIL_E_NULL);
	CHECK(memtrail_spawn(NULL, (const char *const *)empty, &s) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_spawn(NULL, (const char *const *)missing, &s) == MEMTRAIL_E_NOT_FOUND);
	CHECK(memtrail_track_pid(NULL, -1, &s) == MEMTRAIL_E_INVALID);

	memset(&rc, 0, sizeof(rc));
	rc.size = sizeof(rc);
	memset(&t, 0, sizeof(t));
	t.size = sizeof(t);
	CHECK(memtrail_snapshot(NULL, &t) == MEMTRAIL_E_NULL);
	CHECK(memtrail_region_begin(NULL, "x") == MEMTRAIL_E_NULL);
	CHECK(memtrail_region_end(NULL, &rc) == MEMTRAIL_E_NULL);
	CHECK(memtrail_wait(NULL, NULL) == MEMTRAIL_E_NULL);
	CHECK(memtrail_write_profile(NULL, "x") == MEMTRAIL_E_NULL);
	/* A no-op, as free(NULL) (issue 27). */
	CHECK(memtrail_session_free(NULL) == MEMTRAIL_OK);
	CHECK(memtrail_snapshot((memtrail_session *)&not_a_session, &t) == MEMTRAIL_E_HANDLE);
	CHECK(memtrail_session_free((memtrail_session *)&not_a_session) == MEMTRAIL_E_HANDLE);

	CHECK(memtrail_track_self(NULL, &s) == MEMTRAIL_OK);
	CHECK(memtrail_region_end(s, &rc) == MEMTRAIL_E_STATE);
	CHECK(memtrail_region_begin(s, NULL) == MEMTRAIL_E_NULL);
	CHECK(memtrail_region_begin(s, "\xff\xfe") == MEMTRAIL_E_INVALID);
	CHECK(memtrail_snapshot(s, NULL) == MEMTRAIL_E_NULL);
	t.size = 4;
	CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_E_INVALID);
	CHECK(memtrail_write_profile(s, NULL) == MEMTRAIL_E_NULL);
	CHECK(memtrail_write_profile(s, "/nonexistent-dir/profile.json") == MEMTRAIL_E_OUTPUT);
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	/* Double free of a session. */
	CHECK(memtrail_session_free(s) == MEMTRAIL_E_HANDLE);
	CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_E_HANDLE);
	return 0;
}

/* Frees a session, starts another (whose memory may be where the first
 * one's was) and uses the freed handle: MEMTRAIL_E_HANDLE from every call,
 * the new session unaffected (issue 27: handles were addresses, and the
 * stale one reached the new session). Three rounds, so that the allocator
 * has its chances to reuse the memory. */
static int stale(void)
{
	memtrail_session *old = NULL, *s = NULL;
	memtrail_region_counts rc;
	memtrail_totals t;
	void *a;
	int round;

	memset(&t, 0, sizeof(t));
	t.size = sizeof(t);
	memset(&rc, 0, sizeof(rc));
	rc.size = sizeof(rc);
	CHECK(memtrail_track_self(NULL, &old) == MEMTRAIL_OK);
	for (round = 0; round < 3; round++) {
		CHECK(memtrail_session_free(old) == MEMTRAIL_OK);
		CHECK(memtrail_track_self(NULL, &s) == MEMTRAIL_OK);
		CHECK(s != old);
		CHECK(memtrail_snapshot(old, &t) == MEMTRAIL_E_HANDLE);
		CHECK(memtrail_region_begin(old, "stale") == MEMTRAIL_E_HANDLE);
		CHECK(memtrail_region_end(old, &rc) == MEMTRAIL_E_HANDLE);
		CHECK(memtrail_wait(old, NULL) == MEMTRAIL_E_HANDLE);
		CHECK(memtrail_write_profile(old, "/nonexistent-dir/p.json") ==
		      MEMTRAIL_E_HANDLE);
		CHECK(memtrail_session_free(old) == MEMTRAIL_E_HANDLE);
		/* The new one counts exactly, and its region was not ended by
		 * the stale handle's calls. */
		CHECK(memtrail_region_begin(s, "fresh") == MEMTRAIL_OK);
		a = malloc(123);
		free(a);
		CHECK(memtrail_region_end(s, &rc) == MEMTRAIL_OK);
		CHECK(rc.allocations == 1 && rc.frees == 1 && rc.allocated_bytes == 123);
		CHECK(memtrail_snapshot(s, &t) == MEMTRAIL_OK);
		old = s;
	}
	CHECK(memtrail_session_free(s) == MEMTRAIL_OK);
	return 0;
}

struct waiter {
	memtrail_session *s;
	atomic_long tid;
	int rc;
	int code;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;

	atomic_store(&w->tid, (long)syscall(SYS_gettid));
	w->rc = memtrail_wait(w->s, &w->code);
	return NULL;
}

/* The number of the system call thread TID is blocked in, -1 if it runs. */
static long blocked_in(long tid)
{
	char path[64], buf[256] = { 0 };
	FILE *f;
	long nr = -1;

	snprintf(path, sizeof(path), "/proc/self/task/%ld/syscall", tid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f) || sscanf(buf, "%ld", &nr) != 1)
		nr = -1;
	fclose(f);
	return nr;
}

/* A thread waits for a command that runs until told to exit; meanwhile
 * this one takes snapshots and a region, then tells the command to exit
 * (issue 27: memtrail_wait held the session, and a snapshot waited for the
 * command's end, here forever: the alarm fails the test). */
static int wait_snapshot(void)
{
	char script[64];
	char *argv[] = { "/bin/sh", "-c", script, NULL };
	struct waiter w = { .s = NULL, .tid = 0, .rc = -1, .code = 0 };
	struct timespec ms = { .tv_sec = 0, .tv_nsec = 1000000 };
	memtrail_region_counts rc;
	memtrail_totals t;
	uint64_t seen = 0;
	pthread_t thread;
	int fds[2], i;
	long nr;

	alarm(120);
	CHECK(pipe(fds) == 0);
	/* The command gets the read end only: if this process dies, it reads
	 * EOF and exits. */
	CHECK(fcntl(fds[1], F_SETFD, FD_CLOEXEC) == 0);
	CHECK(snprintf(script, sizeof(script), "read line <&%d; exit 5", fds[0]) <
	      (int)sizeof(script));
	CHECK(memtrail_spawn(NULL, (const char *const *)argv, &w.s) == MEMTRAIL_OK);
	close(fds[0]);
	CHECK(pthread_create(&thread, NULL, wait_thread, &w) == 0);
	/* Until the waiter is blocked waiting for the command: in wait4
	 * (waitpid) or waitid. */
	while (atomic_load(&w.tid) == 0 ||
	       ((nr = blocked_in(atomic_load(&w.tid))) != SYS_wait4 && nr != SYS_waitid))
		nanosleep(&ms, NULL);
	for (i = 0; i < 5; i++) {
		memset(&t, 0, sizeof(t));
		t.size = sizeof(t);
		CHECK(memtrail_snapshot(w.s, &t) == MEMTRAIL_OK);
		CHECK(t.allocations >= seen);
		seen = t.allocations;
	}
	memset(&rc, 0, sizeof(rc));
	rc.size = sizeof(rc);
	CHECK(memtrail_region_begin(w.s, "while waiting") == MEMTRAIL_OK);
	CHECK(memtrail_region_end(w.s, &rc) == MEMTRAIL_OK);
	/* Still waiting: the command has not been told to exit. */
	nr = blocked_in(atomic_load(&w.tid));
	CHECK(nr == SYS_wait4 || nr == SYS_waitid);
	CHECK(write(fds[1], "go\n", 3) == 3);
	CHECK(pthread_join(thread, NULL) == 0);
	CHECK(w.rc == MEMTRAIL_OK);
	CHECK(w.code == 5);
	CHECK(memtrail_wait(w.s, NULL) == MEMTRAIL_OK);
	CHECK(memtrail_session_free(w.s) == MEMTRAIL_OK);
	close(fds[1]);
	return 0;
}

static pthread_key_t teardown_key;
static memtrail_session *teardown_session;
static _Atomic int teardown_step = -1;

/* A pthread-key destructor: glibc runs them after the thread's C++ (and
 * Rust) thread-local destructors, memtrail's last error included. */
static void teardown_calls(void *arg)
{
	memtrail_totals t;

	(void)arg;
	memset(&t, 0, sizeof(t));
	t.size = sizeof(t);
	teardown_step = 1;
	if (memtrail_snapshot(NULL, &t) != MEMTRAIL_E_NULL)
		return;
	teardown_step = 2;
	if (!strstr(memtrail_last_error(), "NULL"))
		return;
	teardown_step = 3;
	if (memtrail_snapshot(teardown_session, &t) != MEMTRAIL_OK)
		return;
	teardown_step = 4;
	if (memtrail_region_end(teardown_session, NULL) != MEMTRAIL_E_NULL ||
	    !strstr(memtrail_last_error(), "NULL"))
		return;
	teardown_step = 0;
}

static _Atomic int teardown_thread_ok;

static void *teardown_thread(void *arg)
{
	memtrail_totals t;

	(void)arg;
	memset(&t, 0, sizeof(t));
	t.size = sizeof(t);
	/* A failed call first, so that the thread has a last error to tear
	 * down. */
	teardown_thread_ok = pthread_setspecific(teardown_key, &teardown_key) == 0 &&
			     memtrail_snapshot(NULL, &t) == MEMTRAIL_E_NULL &&
			     strlen(memtrail_last_error()) > 0 &&
			     memtrail_snapshot(teardown_session, &t) == MEMTRAIL_OK;
	return NULL;
}

/* Calls memtrail in a thread's pthread-key destructor, after its
 * thread-locals are gone: each call returns its code, memtrail_last_error
 * its message (issue 27: the process aborted). */
static int teardown(void)
{
	pthread_t thread;

	CHECK(memtrail_track_self(NULL, &teardown_session) == MEMTRAIL_OK);
	CHECK(pthread_key_create(&teardown_key, teardown_calls) == 0);
	CHECK(pthread_create(&thread, NULL, teardown_thread, NULL) == 0);
	CHECK(pthread_join(thread, NULL) == 0);
	CHECK(teardown_thread_ok);
	if (teardown_step != 0)
		fprintf(stderr, "teardown: failed at step %d (last error: %s)\n",
			teardown_step, memtrail_last_error());
	CHECK(teardown_step == 0);
	CHECK(memtrail_session_free(teardown_session) == MEMTRAIL_OK);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "self"))
		return track_self();
	if (argc == 3 && !strcmp(argv[1], "spawn"))
		return spawn(argv[2]);
	if (argc == 5 && !strcmp(argv[1], "report"))
		return report(argv[2], argv[3], argv[4]);
	if (argc == 2 && !strcmp(argv[1], "errors"))
		return errors();
	if (argc == 3 && !strcmp(argv[1], "fork"))
		return fork_child(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "retry"))
		return retry(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "reaped"))
		return reaped(argv[2]);
	if (argc == 2 && !strcmp(argv[1], "newer"))
		return newer();
	if (argc == 2 && !strcmp(argv[1], "stale"))
		return stale();
	if (argc == 2 && !strcmp(argv[1], "wait-snapshot"))
		return wait_snapshot();
	if (argc == 2 && !strcmp(argv[1], "teardown"))
		return teardown();
	fprintf(stderr, "usage: client self|spawn PROFILE|report PROFILE TEXT PPROF|errors|"
			"fork PROFILE|retry PROFILE|reaped PROFILE|newer|stale|wait-snapshot|"
			"teardown\n");
	return 2;
}
