"""`run(cmd, ...)` and `Popen(cmd, ...)`: `subprocess.run` and `subprocess.Popen` for `python -m MODULE ...`, `python -c
CODE ...` and `python SCRIPT ...`, without paying the heavy imports (torch, diffusers, peft, transformers: 6-10 CPU
seconds here) once per command.

One process per test worker (the zygote, `serve` in a `python -c` of its own) imports those libraries once, then forks
a child per command; the child starts as a fresh interpreter would for that command line (its `sys.argv`, `sys.path`
with PYTHONPATH, environment, working folder, standard streams, process group or session) and ends as one does
(atexit handlers, the exit code of `SystemExit`, a traceback and 1 for an uncaught exception, death by Ctrl-C). The
command itself — parsing, loading, training, writing, its signal handling and child processes — runs exactly as in a
new process; only the library imports are shared, as `tools/nbtest.py` shares them for the notebooks. Its standard
streams are the test's own files: the child opens them through /proc/TEST_PID/fd (pipes, /dev/null, files).

A command the zygote cannot start faithfully goes to `subprocess` itself: another interpreter or options before the
command, arguments `subprocess` has and these do not, or an environment that differs from the zygote's in a variable
those libraries read when imported (threads, CPU capability, Hugging Face and torch settings). FLOWGRPO_TEST_COLD=1
sends every command there."""
import json, os, select, signal, subprocess, sys, tempfile, threading, time
from pathlib import Path

PRELOAD = ('torch', 'safetensors.torch', 'numpy', 'PIL.Image', 'diffusers', 'peft', 'transformers', 'accelerate',
           'tqdm')
# variables a preloaded library reads at import: a command whose value differs starts a real interpreter
IMPORT_TIME = ('OMP_', 'MKL_', 'KMP_', 'ONEDNN_', 'DNNL_', 'ATEN_', 'TORCH', 'PYTORCH_', 'CUDA', 'HF_', 'HUGGINGFACE',
               'TRANSFORMERS_', 'DIFFUSERS_', 'PEFT_', 'ACCELERATE_', 'TOKENIZERS_', 'XDG_', 'LD_', 'PYTHONHASHSEED',
               'PYTHONWARNINGS', 'PYTHONDONTWRITEBYTECODE', 'PYTHONOPTIMIZE', 'PYTHONSAFEPATH', 'PYTHONNOUSERSITE',
               'PYTHONHOME', 'PYTHONSTARTUP', 'PYTHONIOENCODING', 'PYTHONUTF8', 'HOME')
ZYGOTE_ENV = {'OMP_NUM_THREADS': '1'}  # what the test files give their commands
READ_LATER = ('TORCHINDUCTOR_CACHE_DIR',)  # set by torch in a test's process; read when used, not at import


def _startup(env:dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in READ_LATER}


# ---- the zygote's side

def _child(req:dict, proto:tuple, fds:list):
    """In the forked child: become the command's fresh interpreter (standard streams: `fds`, opened by the zygote),
    run it, exit as Python would."""
    import atexit, runpy, traceback
    for fd in proto: os.close(fd)
    if req['session']: os.setsid()
    elif req['group']: os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req['cwd'])
    os.environ.clear(); os.environ.update(req['env'])
    tempfile.tempdir = None  # TMPDIR is read again
    for std, f in enumerate(fds): os.dup2(f, std)
    for f in set(fds): os.close(f)
    if req['stderr_to_stdout']: os.dup2(1, 2)
    unbuffered = bool(os.environ.get('PYTHONUNBUFFERED'))
    sys.stdin = open(0, 'r', closefd=False)
    sys.stdout = open(1, 'w', closefd=False, buffering=1 if unbuffered else -1)
    sys.stderr = open(2, 'w', closefd=False, buffering=1, errors='backslashreplace')
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    kind, target, args = req['kind'], req['target'], req['args']
    extra = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    first = {'m': os.getcwd(), 'c': '', 's': str(Path(target).resolve().parent)}[kind]
    sys.path[:] = [first, *extra, *req['base_path']]
    import builtins, __main__  # the zygote's __main__ is `-c` code that only imported this module: emptied
    __main__.__dict__.clear(); __main__.__dict__.update(__name__='__main__', __builtins__=builtins, __doc__=None)
    code = 0
    try:
        if kind == 'm':
            sys.argv = ['-m', *args]
            runpy._run_module_as_main(target, alter_argv=True)
        elif kind == 'c':
            sys.argv = ['-c', *args]
            exec(compile(target, '<string>', 'exec'), __main__.__dict__)
        else:
            sys.argv = [target, *args]
            runpy.run_path(target, run_name='__main__')
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt as e:  # as Python: the traceback, then death by SIGINT
        e.__traceback__ = e.__traceback__.tb_next
        traceback.print_exception(type(e), e, e.__traceback__); sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        kind_, e, tb = sys.exc_info()
        e.__traceback__ = tb.tb_next  # from the command's first frame, as Python shows it
        sys.excepthook(kind_, e, tb.tb_next); code = 1
    if code is None: code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr); code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush(); sys.stderr.flush()
    finally:
        os._exit(code & 0xff)


def serve(base_path:list):
    """The zygote (started as `python -c 'import warm; warm.serve(PATH)'`, PATH: its `sys.path` without the tests
    folder): preload, then one JSON request a line on stdin -> a forked child; answers {'id', 'pid'} at once and
    {'pid', 'rc'} when that child ends, one JSON line each on stdout."""
    import importlib
    inp, out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0); os.dup2(2, 1)
    for m in PRELOAD:
        try: importlib.import_module(m)
        except ImportError: pass
    try: from diffusers import FluxPipeline, StableDiffusion3Pipeline  # noqa: F401 (their lazy modules)
    except ImportError: pass

    def say(d): os.write(out, (json.dumps(d) + '\n').encode())
    say('ready')
    buf, children, open_ = b'', set(), True
    while open_ or children:
        if open_ and select.select([inp], [], [], 0.02)[0]:
            chunk = os.read(inp, 65536)
            if not chunk: open_ = False  # the test's process ended: its commands still finish
            buf += chunk
            while b'\n' in buf:
                line, buf = buf.split(b'\n', 1)
                req = json.loads(line)
                req['base_path'] = base_path
                sys.stdout.flush(); sys.stderr.flush()
                fds = [os.open(path, flags) for path, flags in req['fds']]  # before the test closes its ends
                pid = os.fork()
                if pid == 0: _child(req, (inp, out), fds)
                for f in fds: os.close(f)
                children.add(pid)
                say({'id': req['id'], 'pid': pid})
        elif not open_: time.sleep(0.02)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid: break
            children.discard(pid)
            if open_: say({'pid': pid, 'rc': os.waitstatus_to_exitcode(status)})
    os._exit(0)


# ---- the test's side

class _Zygote:
    "The test process's handle on its zygote: requests, and the answers read as they come."
    def __init__(self):
        self.env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'} | ZYGOTE_ENV
        code = (f'import sys; base = sys.path[1:]; sys.path.insert(0, {str(Path(__file__).parent)!r}); '
                'import warm; warm.serve(base)')
        self.proc = subprocess.Popen([sys.executable, '-c', code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=self.env)  # its own imports' warnings: no test's
        self.buf, self.pids, self.rcs, self.n, self.lock = b'', {}, {}, 0, threading.RLock()
        if self._read(None) != 'ready': raise RuntimeError('the warm interpreter did not start')

    def _read(self, timeout):
        "The next answer (decoded JSON), or None when none came within `timeout` seconds."
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b'\n' not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]: return None
            chunk = os.read(fd, 65536)
            if not chunk: raise RuntimeError('the warm interpreter ended')
            self.buf += chunk
        line, self.buf = self.buf.split(b'\n', 1)
        msg = json.loads(line)
        if isinstance(msg, dict) and 'rc' in msg: self.rcs[msg['pid']] = msg['rc']
        elif isinstance(msg, dict): self.pids[msg['id']] = msg['pid']
        return msg

    def start(self, req:dict) -> int:
        with self.lock:
            self.n += 1; req['id'] = self.n
            self.proc.stdin.write((json.dumps(req) + '\n').encode()); self.proc.stdin.flush()
            while self.n not in self.pids: self._read(None)
            return self.pids.pop(self.n)

    def poll(self, pid:int, timeout=0.0):
        "`pid`'s exit code once it ended, else None (waiting up to `timeout` seconds; None: until it ends)."
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while pid not in self.rcs:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0: return None
                self._read(None if left is None else min(left, 0.05) if left > 0 else 0)
            return self.rcs[pid]


_zygote, _lock = None, threading.Lock()


def _get() -> _Zygote:
    global _zygote
    with _lock:
        if _zygote is None or _zygote.proc.poll() is not None: _zygote = _Zygote()
        return _zygote


def _parse(cmd:list):
    "(kind, target, args) for `python -m M ...`, `python -c CODE ...`, `python SCRIPT ...`; None for anything else."
    cmd = list(map(os.fspath, cmd))
    if len(cmd) < 2 or cmd[0] != sys.executable: return None
    if cmd[1] in ('-m', '-c'): return (cmd[1][1], cmd[2], cmd[3:]) if len(cmd) > 2 else None
    if cmd[1].startswith('-'): return None
    return 's', cmd[1], cmd[2:]


def _warm(cmd, env) -> bool:
    "Whether `cmd` with `env` can start in the warm interpreter."
    if _parse(cmd) is None or os.environ.get('FLOWGRPO_TEST_COLD'): return False
    return _startup(env) == _startup(_get().env)


def _fd_path(fd:int, write:bool) -> tuple:
    "(path, open flags) by which the child opens the test's file descriptor `fd`."
    return f'/proc/{os.getpid()}/fd/{fd}', (os.O_WRONLY | os.O_APPEND) if write else os.O_RDONLY


class Popen:
    """`subprocess.Popen(cmd, ...)` for a Python command (stdin, stdout and stderr: None, DEVNULL, PIPE, STDOUT for
    stderr, a file or a descriptor; text; cwd; env; start_new_session), its process a child of the warm interpreter:
    pid, poll, wait, send_signal, terminate, kill, communicate, returncode, stdout, stderr, and `with`."""
    def __new__(cls, cmd, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None, text=False,
                start_new_session=False, universal_newlines=None, **kw):
        env = dict(os.environ if env is None else env)
        if kw or not _warm(cmd, env):
            return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, text=text,
                                    start_new_session=start_new_session, universal_newlines=universal_newlines, **kw)
        self = super().__new__(cls)
        self._start(cmd, cwd, env, stdin, stdout, stderr, text or bool(universal_newlines), start_new_session)
        return self

    def _start(self, cmd, cwd, env, stdin, stdout, stderr, text, session):
        self.args, self.returncode, self.stdin, self.stdout, self.stderr = cmd, None, None, None, None
        close, fds = [], []
        def fd_of(spec, std:int, write:bool):
            nonlocal close
            if spec is None: return std
            if spec == subprocess.DEVNULL:
                f = os.open(os.devnull, os.O_RDWR); close.append(f); return f
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                mine, theirs = (r, w) if write else (w, r)
                close.append(theirs)
                f = os.fdopen(mine, ('r' if write else 'w') + ('' if text else 'b'))
                setattr(self, ('stdin', 'stdout', 'stderr')[std], f)
                return theirs
            return spec if isinstance(spec, int) else spec.fileno()
        fds.append(_fd_path(fd_of(stdin, 0, False), False))
        fds.append(_fd_path(fd_of(stdout, 1, True), True))
        to_stdout = stderr == subprocess.STDOUT
        fds.append(fds[1] if to_stdout else _fd_path(fd_of(stderr, 2, True), True))
        kind, target, args = _parse(cmd)
        try:
            self.pid = _get().start(dict(kind=kind, target=target, args=args, cwd=str(cwd or os.getcwd()), env=env,
                                         fds=fds, stderr_to_stdout=to_stdout, session=session, group=False))
        finally:
            for f in close: os.close(f)

    def poll(self):
        if self.returncode is None: self.returncode = _get().poll(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = _get().poll(self.pid, timeout)
            if self.returncode is None: raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            try: os.kill(self.pid, sig)
            except ProcessLookupError: pass

    def terminate(self): self.send_signal(signal.SIGTERM)
    def kill(self): self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout=None):
        if input is not None and self.stdin: self.stdin.write(input)
        if self.stdin: self.stdin.close()
        out = self.stdout.read() if self.stdout else None
        err = self.stderr.read() if self.stderr else None
        self.wait(timeout)
        return out, err

    def __enter__(self): return self

    def __exit__(self, *exc):
        for f in (self.stdout, self.stderr, self.stdin):
            if f: f.close()
        self.wait()


def run(cmd, *, cwd=None, env=None, timeout=None, input=None, capture_output=False, text=False, check=False,
        stdout=None, stderr=None, **kw):
    """As `subprocess.run(cmd, ...)` (capture_output, text, input, timeout, check, cwd, env); a Python command runs in
    a child of the warm interpreter (a process group of its own, killed with its children on timeout), anything else
    in a new process."""
    env = dict(os.environ if env is None else env)
    if stdout is not None or stderr is not None or kw or not _warm(cmd, env):
        return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, input=input, capture_output=capture_output,
                              text=text, check=check, stdout=stdout, stderr=stderr, **kw)
    z = _get()
    with tempfile.TemporaryDirectory(prefix='warm-') as tmp:
        files = {n: Path(tmp)/n for n in ('in', 'out', 'err')}
        for f in files.values(): f.touch()
        if input is not None: files['in'].write_bytes(input.encode() if isinstance(input, str) else input)
        kind, target, args = _parse(cmd)
        fds = [(str(files['in']) if input is not None else os.devnull, os.O_RDONLY),
               (str(files['out']), os.O_WRONLY | os.O_TRUNC), (str(files['err']), os.O_WRONLY | os.O_TRUNC)]
        pid = z.start(dict(kind=kind, target=target, args=args, cwd=str(cwd or os.getcwd()), env=env, fds=fds,
                           stderr_to_stdout=False, session=False, group=True))
        rc = z.poll(pid, timeout)
        if rc is None:
            try: os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError: pass
            z.poll(pid, None)
        out, err = (files[n].read_bytes() for n in ('out', 'err'))
    if text: out, err = out.decode(errors='replace'), err.decode(errors='replace')
    if rc is None: raise subprocess.TimeoutExpired(cmd, timeout, out, err)
    if not capture_output:
        for stream, data in ((sys.stdout, out), (sys.stderr, err)):
            stream.write(data if text else data.decode(errors='replace'))
        out = err = None
    r = subprocess.CompletedProcess(cmd, rc, out, err)
    if check: r.check_returncode()
    return r
