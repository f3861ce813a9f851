"""Child processes forked from a "zygote" that has imported Keras and the package once.

Tests that kill a training run need it in a process of its own. A fresh interpreter
spends ~12 of its ~14 s importing Keras, TensorFlow (tf.data, the tokenizer) and the
backend; a fork of a process that has done those imports starts in milliseconds. The
zygote runs no test code itself: each child starts from a process that has only
imported, as a fresh one would, and is a process of its own (its own pid, killed with
SIGKILL, its exit status read by the zygote's waitpid). Not for tests that need what
only a new interpreter has (another hash seed, another backend, first imports).

Written here rather than with multiprocessing's forkserver: that one is a process-wide
singleton, started with the parent's environment, that outlives the test.

    with Zygote(env) as zygote:
        status, output = zygote.run(SOURCE, ["script", "arg"], tmp_path / "child.log")
"""

import json
import subprocess
import sys
import textwrap
import time

SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, traceback
    for module in json.loads(sys.argv[1]):  # the children's imports, done once
        __import__(module)

    def child(request):
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if request["err"] else log
        os.dup2(log, 1), os.dup2(err, 2)
        signal.alarm(request["timeout"])  # a hung child dies with SIGALRM, which its status says
        sys.argv, code = request["argv"], 0
        try:
            exec(compile(request["source"], request["argv"][0], "exec"), {"__name__": "__main__"})
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "start":
            pid = os.fork()
            if pid == 0:
                child(request)
            answer = pid
        else:  # "wait", or "poll" (None while the child runs)
            flags = os.WNOHANG if request["op"] == "poll" else 0
            pid, status = os.waitpid(request["pid"], flags)
            answer = os.waitstatus_to_exitcode(status) if pid else None
        print(json.dumps(answer), flush=True)
    """
)

PRELOAD = ("keras", "tensorflow", "keras_transformer", "keras_transformer.train.run")


class Zygote:
    """A process that forks children which run Python source as `__main__`.

    Args:
        env: the environment of the zygote, so of every child: set `KERAS_BACKEND` and
            thread counts here (they are read at import).
        preload: modules imported once, before any child.
    """

    def __init__(self, env, preload=PRELOAD):
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(list(preload))],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.ready = False  # read at the first request, so that zygotes started together import side by side
        self.statuses = {}  # pid -> exit status of the children reaped already

    def _ask(self, **request):
        if not self.ready:
            assert self.process.stdout.readline() == "ready\n", "the zygote did not start"
            self.ready = True
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, "the zygote died"
        return json.loads(answer)

    def start(self, source, argv, log, timeout=300, err=None):
        """Forks a child that runs `source` with `sys.argv = argv`, its output in `log`; its pid.

        `err`: a file of its own for the child's stderr (default: `log` holds both).
        """
        return self._ask(
            op="start", source=source, argv=[str(a) for a in argv], log=str(log), timeout=timeout,
            err=None if err is None else str(err),
        )

    def poll(self, pid):
        """The child's exit status, or None while it runs."""
        if pid not in self.statuses:
            status = self._ask(op="poll", pid=pid)
            if status is None:
                return None
            self.statuses[pid] = status  # waitpid reaps a child once: keep its status for `wait`
        return self.statuses[pid]

    def wait(self, pid):
        """The child's exit status, as `subprocess` gives it: negative for a signal."""
        if pid not in self.statuses:
            self.statuses[pid] = self._ask(op="wait", pid=pid)
        return self.statuses[pid]

    def wait_for(self, path, pid, timeout):
        """Waits until `path` exists, the child `pid` exits or `timeout` seconds pass.

        Returns whether `path` exists: a test's child writes it at the point the test acts on.
        """
        deadline = time.monotonic() + timeout
        while not path.exists() and self.poll(pid) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return path.exists()

    def run(self, source, argv, log, timeout=300):
        """Runs a child to its end: `(exit status, its output)`."""
        status = self.wait(self.start(source, argv, log, timeout))
        with open(log, encoding="utf-8", errors="replace") as file:
            return status, file.read()

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
