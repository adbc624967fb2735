/* A C client of memtrail's C ABI (issue 13), run by tests/ffi_c.rs:
 * `client self` tracks itself and checks a region's exact counts, `client
 * spawn PROFILE` tracks a child, `client errors` checks every error path,
 * `client fork PROFILE` calls a session from a child of fork, `client
 * retry PROFILE` writes a profile again after a failed write, `client
 * reaped PROFILE` waits for a command it reaped itself (issue 28).
 * Built with -O0 -fno-builtin so that every malloc and free is a call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

		/* One built against a newer, larger header: its size is cut to
		 * this library's, and nothing past that is touched. */
		memset(&old, 0xaa, sizeof(old));
		CHECK(memtrail_options_init(&old.opts, sizeof(old.bytes)) == MEMTRAIL_OK);
		CHECK(old.opts.size == sizeof(memtrail_options));
		for (i = sizeof(memtrail_options); i < sizeof(old.bytes); i++)
			CHECK(old.bytes[i] == 0xaa);
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
	CHECK(memtrail_session_free(NULL) == MEMTRAIL_E_NULL);
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
	fprintf(stderr, "usage: client self|spawn PROFILE|report PROFILE TEXT PPROF|errors|"
			"fork PROFILE|retry PROFILE|reaped PROFILE\n");
	return 2;
}
