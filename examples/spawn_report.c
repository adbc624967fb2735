/* A command's profile and its report, through memtrail's C ABI
 * (include/memtrail.h): spawn the command tracked from its first
 * instruction, wait for it, write its profile, then render the profile's
 * top allocation sites as `memtrail report --by peak --top 5` would.
 *
 *   spawn_report PROFILE.json CMD [ARGS...]
 *
 * Build and run (as root, or with memtrail's capabilities):
 *   cargo build --release --lib
 *   cc -Iinclude examples/spawn_report.c -Ltarget/release -lmemtrail \
 *      -Wl,-rpath,$PWD/target/release -o spawn_report
 *   ./spawn_report /tmp/ls.json ls -l /
 * tests/examples.rs builds it and runs it on a program that allocates
 * 900,001 bytes once. */
#include <stdio.h>

#include "memtrail.h"

static int fail(const char *what, memtrail_session *session)
{
	fprintf(stderr, "spawn_report: %s: %s\n", what, memtrail_last_error());
	memtrail_session_free(session); /* NULL: nothing to do */
	return 1;
}

int main(int argc, char **argv)
{
	memtrail_options opts;
	memtrail_session *session = NULL;
	int code = -1;

	if (argc < 3) {
		fprintf(stderr, "usage: spawn_report PROFILE.json CMD [ARGS...]\n");
		return 2;
	}
	/* Options: the defaults, then what differs. init never writes past the
	 * size it is given, so this keeps working with a later library. */
	if (memtrail_options_init(&opts, sizeof opts) != MEMTRAIL_OK)
		return fail("options", NULL);
	opts.pressure_timeout_ns = UINT64_MAX; /* pause the command rather than lose events */

	if (memtrail_spawn(&opts, (const char *const *)&argv[2], &session) != MEMTRAIL_OK)
		return fail(argv[2], NULL);
	if (memtrail_wait(session, &code) != MEMTRAIL_OK)
		return fail("wait", session);
	/* Finishes the session; the profile is kept until the session is freed
	 * (a failed write can be retried). */
	if (memtrail_write_profile(session, argv[1]) != MEMTRAIL_OK)
		return fail(argv[1], session);
	if (memtrail_session_free(session) != MEMTRAIL_OK)
		return fail("free", NULL);

	printf("%s exited with code %d\n", argv[2], code);
	fflush(stdout);
	/* Needs no session and no privilege: "-" is standard output. */
	if (memtrail_write_report(argv[1], "-", MEMTRAIL_FORMAT_TEXT, MEMTRAIL_METRIC_PEAK, 5) !=
	    MEMTRAIL_OK)
		return fail("report", NULL);
	return 0;
}
