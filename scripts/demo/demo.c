/* The demo workload of scripts/run.sh: a small program with the usual
 * allocation patterns — a growing buffer, a linked list, short-lived
 * temporaries from worker threads, a forked child, and a deliberate leak. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Keeps the compiler from eliding malloc/free pairs whose memory is unused. */
void *volatile sink;

struct node {
	struct node *next;
	char payload[48];
};

static void *worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < 1000; i++) {
		char *tmp = malloc(256 + i % 64);
		memset(tmp, i, 256);
		sink = tmp;
		free(tmp);
	}
	return NULL;
}

int main(void)
{
	/* A buffer grown by doubling. */
	size_t cap = 16;
	char *buf = malloc(cap);
	for (size_t len = 0; len < 100000; len++) {
		if (len == cap)
			buf = realloc(buf, cap *= 2);
		buf[len] = (char)len;
	}

	/* A list built and torn down. */
	struct node *head = NULL;
	for (int i = 0; i < 5000; i++) {
		struct node *n = calloc(1, sizeof(*n));
		n->next = head;
		head = n;
	}
	while (head) {
		struct node *next = head->next;
		free(head);
		head = next;
	}

	pthread_t threads[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&threads[i], NULL, worker, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(threads[i], NULL);

	pid_t child = fork();
	if (child == 0) {
		void *scratch = malloc(1 << 20);
		memset(scratch, 1, 1 << 20);
		sink = scratch;
		free(scratch);
		_exit(0);
	}
	waitpid(child, NULL, 0);

	/* Leaked on purpose: memtrail reports it as live at exit. */
	void *leak = malloc(4096);
	memset(leak, 0, 4096);
	sink = leak;
	free(buf);
	return 0;
}
