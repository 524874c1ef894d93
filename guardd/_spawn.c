/* guardd._spawn: CMD's fork and exec as one vfork-like clone3, born in the turn's cgroup.
 *
 * Why C. A guard is a Python process of ~14 MiB; fork() copies its page tables, and until the
 * child execs, every page either side writes is copied again (Python writes reference counts
 * everywhere), then exec tears the copy down: 1.2-2 ms of a turn's start, against ~0.1 ms for
 * subprocess's vfork. A child that shares the guard's memory (CLONE_VM, the guard suspended until
 * it execs: CLONE_VFORK) must not run Python, so what it does between clone and exec is here, in
 * C, with raw system calls only: the same steps, in the same order, as guardd.child._exec_child
 * (which stays the fallback and the reference). clone3 is called directly (glibc 2.36 has no
 * wrapper), with a stack of the child's own and CLONE_INTO_CGROUP, so CMD is born in its cgroup
 * as before.
 *
 * spawn(paths, argv, envp, errw, cgroup_fd, watch_fd, guard_pid, nofile) -> pid
 *   paths: the candidates execve tries in order (os.execvpe's search, done by the caller); argv,
 *   envp: lists of bytes; errw: the write end of a close-on-exec pipe; cgroup_fd: -1 or an
 *   O_DIRECTORY fd of the cgroup; watch_fd: the pidfd whose process must still run at exec (the
 *   supervisor); guard_pid: the parent CMD must still have; nofile: -1 or CMD's soft RLIMIT_NOFILE.
 *   The child reports on errw as guardd.child does ("gone", or the errno of exec as digits), and
 *   exits 125 or 127. Raises OSError when clone3 itself fails (the caller then forks in Python).
 *
 * x86_64 only (the clone3 entry below is assembly); elsewhere the module is not built and
 * guardd.child forks in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#if !defined(__x86_64__) || !defined(__linux__)
#error "guardd._spawn is built for Linux on x86_64 only"
#endif

#define CLONE_VM_ 0x00000100ULL
#define CLONE_VFORK_ 0x00004000ULL
#define CLONE_INTO_CGROUP_ 0x200000000ULL
#define STACK_SIZE (64 * 1024)
#define EXIT_GUARD_FAILURE 125
#define EXIT_NOT_FOUND 127

struct clone_args_ {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    uint64_t set_tid, set_tid_size, cgroup;
};

/* The kernel's sigaction (rt_sigaction takes this, not glibc's). */
struct ksigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    uint64_t mask;
};

struct job {
    char **paths, **argv, **envp;
    int errw, watch_fd, nofile;
    pid_t guard_pid;
};

/* long ccsup_clone3(struct clone_args_ *args, size_t size, int (*fn)(void *), void *arg):
 * the parent gets the child's pid (or -errno); the child, on its own stack, runs fn(arg) and
 * exits with its result. fn and arg ride in r8/r9, which the syscall keeps. */
long ccsup_clone3(struct clone_args_ *args, size_t size, int (*fn)(void *), void *arg);
__asm__(
    ".text\n"
    ".globl ccsup_clone3\n"
    ".hidden ccsup_clone3\n"
    ".type ccsup_clone3,@function\n"
    "ccsup_clone3:\n"
    "    movq %rdx, %r9\n"
    "    movq %rcx, %r8\n"
    "    movl $435, %eax\n" /* __NR_clone3 */
    "    syscall\n"
    "    testq %rax, %rax\n"
    "    jz 1f\n"
    "    ret\n"
    "1:  xorl %ebp, %ebp\n"
    "    andq $-16, %rsp\n"
    "    movq %r8, %rdi\n"
    "    callq *%r9\n"
    "    movl %eax, %edi\n"
    "    movl $231, %eax\n" /* __NR_exit_group */
    "    syscall\n"
    "    hlt\n"
    ".size ccsup_clone3, .-ccsup_clone3\n");

/* Raw system calls: the child shares the guard's memory, so it must not touch errno or any lock
 * of libc's; each returns the kernel's result (-errno on failure). */
static long raw(long n, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

static void report(int fd, const char *what, size_t len) { raw(SYS_write, fd, (long)what, len, 0); }

static int child_main(void *arg) {
    struct job *job = arg;
    struct ksigaction dfl = {0};
    uint64_t none = 0;
    if (job->nofile >= 0) {
        struct rlimit limit;
        if (raw(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, (long)&limit) == 0 &&
            (limit.rlim_max == RLIM_INFINITY || (rlim_t)job->nofile <= limit.rlim_max)) {
            limit.rlim_cur = (rlim_t)job->nofile;
            raw(SYS_prlimit64, 0, RLIMIT_NOFILE, (long)&limit, 0);
        }
    }
    for (int sig = 1; sig <= 64; sig++) { /* every disposition back to default, 32 and 33 too */
        if (sig != SIGKILL && sig != SIGSTOP)
            raw(SYS_rt_sigaction, sig, (long)&dfl, 0, 8);
    }
    raw(SYS_setpgid, 0, 0, 0, 0);
    if (job->guard_pid && raw(SYS_getppid, 0, 0, 0, 0) != job->guard_pid)
        return EXIT_GUARD_FAILURE; /* the guard died before CMD ran: run nothing */
    struct pollfd watch = {.fd = job->watch_fd, .events = POLLIN};
    if (raw(SYS_poll, (long)&watch, 1, 0, 0) > 0) { /* a pidfd reads ready once its process ended */
        report(job->errw, "gone", 4);
        return EXIT_GUARD_FAILURE;
    }
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&none, 0, 8);
    long first = 0, last = -ENOENT;
    for (char **path = job->paths; *path; path++) {
        last = raw(SYS_execve, (long)*path, (long)job->argv, (long)job->envp, 0);
        if (last != -ENOENT && last != -ENOTDIR && !first)
            first = last;
    }
    long err = first ? -first : -last;
    char digits[24];
    int n = sizeof digits;
    do {
        digits[--n] = (char)('0' + err % 10);
        err /= 10;
    } while (err && n);
    report(job->errw, digits + n, sizeof digits - n);
    return EXIT_NOT_FOUND;
}

/* A NULL-terminated array of the bytes in a list (pointers into the list's own objects). */
static char **byte_array(PyObject *list, const char *what) {
    if (!PyList_Check(list)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    char **out = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (out == NULL)
        return (char **)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyBytes_Check(item) || (Py_ssize_t)strlen(PyBytes_AS_STRING(item)) != PyBytes_GET_SIZE(item)) {
            PyMem_Free(out);
            PyErr_Format(PyExc_ValueError, "%s must be bytes without NUL", what);
            return NULL;
        }
        out[i] = PyBytes_AS_STRING(item);
    }
    return out;
}

static PyObject *spawn(PyObject *self, PyObject *args) {
    PyObject *paths_list, *argv_list, *envp_list;
    int errw, cgroup_fd, watch_fd, guard_pid, nofile;
    if (!PyArg_ParseTuple(args, "O!O!O!iiiii", &PyList_Type, &paths_list, &PyList_Type, &argv_list,
                          &PyList_Type, &envp_list, &errw, &cgroup_fd, &watch_fd, &guard_pid,
                          &nofile))
        return NULL;
    struct job job = {.errw = errw, .watch_fd = watch_fd, .guard_pid = guard_pid, .nofile = nofile};
    PyObject *result = NULL;
    void *stack = MAP_FAILED;
    job.paths = byte_array(paths_list, "paths");
    job.argv = job.paths ? byte_array(argv_list, "argv") : NULL;
    job.envp = job.argv ? byte_array(envp_list, "envp") : NULL;
    if (job.envp == NULL)
        goto done;
    stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
                 -1, 0);
    if (stack == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    struct clone_args_ clone = {
        .flags = CLONE_VM_ | CLONE_VFORK_ | (cgroup_fd >= 0 ? CLONE_INTO_CGROUP_ : 0),
        .exit_signal = SIGCHLD,
        .stack = (uint64_t)(uintptr_t)stack,
        .stack_size = STACK_SIZE,
        .cgroup = cgroup_fd >= 0 ? (uint64_t)cgroup_fd : 0,
    };
    /* Every signal blocked across the clone (the child unblocks after resetting handlers: no
     * handler of the guard's may run on the shared memory), 32 and 33 included. */
    uint64_t all = ~(uint64_t)0, old = 0;
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, (long)&old, 8);
    long pid = ccsup_clone3(&clone, sizeof clone, child_main, &job);
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&old, 0, 8);
    if (pid < 0) {
        errno = (int)-pid;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromLong(pid);
done:
    if (stack != MAP_FAILED)
        munmap(stack, STACK_SIZE);
    PyMem_Free(job.paths);
    PyMem_Free(job.argv);
    PyMem_Free(job.envp);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, "Clone (vfork-like, into a cgroup) and exec CMD; see the module."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "guardd._spawn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
