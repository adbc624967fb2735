/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The few kernel types memtrail's BPF programs read, declared for CO-RE.
 *
 * Every struct carries preserve_access_index, so libbpf relocates each field
 * access against the running kernel's BTF at load time: only the fields named
 * here need to exist, at whatever offset the kernel has them. This replaces a
 * multi-megabyte generated vmlinux.h and keeps the build independent of the
 * build machine's kernel.
 */
#ifndef MEMTRAIL_VMLINUX_MIN_H
#define MEMTRAIL_VMLINUX_MIN_H
/* Tells bpf_tracing.h that pt_regs has the kernel field names (di, si, ...). */
#define __VMLINUX_H__

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1

#define false 0

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_ARRAY_OF_MAPS = 12,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_F_NO_PREALLOC = 1,
	BPF_F_MMAPABLE = 1024,
};

enum {
	BPF_LOCAL_STORAGE_GET_F_CREATE = 1,
};

/* Flags of bpf_ringbuf_submit/discard/output and bpf_ringbuf_query. */
enum {
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
};
enum {
	BPF_RB_AVAIL_DATA = 0,
	BPF_RB_RING_SIZE = 1,
	BPF_RB_CONS_POS = 2,
	BPF_RB_PROD_POS = 3,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

/* User registers as uprobes see them (x86_64 kernel layout). */
struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long bp;
	unsigned long bx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long flags;
	unsigned long sp;
	unsigned long ss;
};

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
	unsigned int flags;
} __attribute__((preserve_access_index));

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct super_block {
	unsigned int s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct file *vm_file;
} __attribute__((preserve_access_index));

/* Linux 6.2 and later: one per-CPU counter per enum mt_mm_counter. */
struct percpu_counter {
	__s64 count;
} __attribute__((preserve_access_index));

struct task_struct;

struct mm_struct {
	unsigned long start_code;
	struct percpu_counter rss_stat[4];
	struct task_struct *owner; /* CONFIG_MEMCG */
} __attribute__((preserve_access_index));

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct pid_namespace {
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

enum pid_type {
	PIDTYPE_PID,
	PIDTYPE_TGID,
	PIDTYPE_PGID,
	PIDTYPE_SID,
	PIDTYPE_MAX,
};

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

/* Signal dispositions (a stop signal with a handler does not stop). */
struct sigaction {
	void *sa_handler;
} __attribute__((preserve_access_index));

struct k_sigaction {
	struct sigaction sa;
} __attribute__((preserve_access_index));

struct sighand_struct {
	struct k_sigaction action[64];
} __attribute__((preserve_access_index));

/* The signal's origin (a siginfo; SEND_SIG_PRIV, (void *)1, for a signal
 * the kernel sends on its own account). */
struct kernel_siginfo {
	int si_signo;
	int si_errno;
	int si_code;
} __attribute__((preserve_access_index));

/* The cgroup v2 freezer's state: e_freeze, the cgroup or an ancestor
 * frozen. */
struct cgroup_freezer_state {
	bool freeze;
	bool e_freeze;
} __attribute__((preserve_access_index));

struct cgroup {
	struct cgroup_freezer_state freezer;
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

/* x86_64: the thread's fs base, which glibc makes its pthread_self(). */
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct pid *thread_pid;
	int exit_code;
	struct files_struct *files;
	struct mm_struct *mm;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct signal_struct *signal;
	struct sighand_struct *sighand;
	struct css_set *cgroups;
	struct thread_struct thread;
	/* Set in a vfork child until it execs or exits. */
	struct completion *vfork_done;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

/* Raw syscall tracepoint contexts (tracepoint/raw_syscalls layout). */
struct trace_event_raw_sys_enter {
	unsigned short common_type;
	unsigned char common_flags;
	unsigned char common_preempt_count;
	int common_pid;
	long id;
	unsigned long args[6];
};

struct trace_event_raw_sys_exit {
	unsigned short common_type;
	unsigned char common_flags;
	unsigned char common_preempt_count;
	int common_pid;
	long id;
	long ret;
};

/* Opaque handles of the dynptr helpers and the numbers iterator behind
 * bpf_for() (uapi bpf.h; the kernel checks their size only). */
struct bpf_dynptr {
	__u64 __opaque[2];
} __attribute__((aligned(8)));

struct bpf_iter_num {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

#endif /* MEMTRAIL_VMLINUX_MIN_H */
