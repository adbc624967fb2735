/* The benchmark program of the CI example (memtrail.toml): a stand-in for
 * yours. It reads a JSON array of numbers, keeps each number in a list
 * node, sums them and frees everything: 1 allocation for the file's bytes
 * and 1 of 32 bytes per number, the same on every run, which is what makes
 * memory metrics exact enough to gate on (`memtrail compare` exits 1 on
 * any growth past --threshold).
 *
 *   cc -O2 -o build/parse examples/ci/parse.c && ./build/parse testdata/small.json
 *
 * tests/examples.rs builds it in a project laid out as the workflow
 * expects and runs the workflow's bench and compare commands on it. No
 * stdio: its buffers would be allocations of their own. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct node {
	struct node *next;
	long value;
	char pad[16];
};

static char *slurp(const char *path, size_t *len)
{
	struct stat st;
	char *buf = NULL;
	ssize_t got = -1;
	int fd = open(path, O_RDONLY);

	if (fd >= 0 && fstat(fd, &st) == 0 && (buf = malloc((size_t)st.st_size + 1)))
		got = read(fd, buf, (size_t)st.st_size);
	if (fd >= 0)
		close(fd);
	if (got < 0) {
		free(buf);
		return NULL;
	}
	buf[got] = '\0';
	*len = (size_t)got;
	return buf;
}

int main(int argc, char **argv)
{
	struct node *head = NULL;
	char digits[24], *text, *p, *end;
	size_t len, n = sizeof(digits);
	long sum = 0;

	if (argc != 2 || !(text = slurp(argv[1], &len)))
		return 2;
	for (p = text; p < text + len; p = end) {
		long v = strtol(p, &end, 10);
		struct node *node;

		if (end == p) { /* not a number: '[', ',', ']', spaces */
			end = p + 1;
			continue;
		}
		if (!(node = malloc(sizeof(*node))))
			return 1;
		node->value = v;
		node->next = head;
		head = node;
	}
	while (head) {
		struct node *next = head->next;

		sum += head->value;
		free(head);
		head = next;
	}
	free(text);
	digits[--n] = '\n';
	do {
		digits[--n] = (char)('0' + sum % 10);
		sum /= 10;
	} while (sum && n);
	return write(1, digits + n, sizeof(digits) - n) < 0;
}
