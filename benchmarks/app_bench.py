"""Benchmark of the app under load (not a test): 20 concurrent clients on 127.0.0.1, most sending short Generate
requests while a few send long Credit strips (or long Generate requests), against the app served by a second process.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/app_bench.py [--clients 20] [--long 3] [--requests 1]
        [--runs 2] [--steps 4] [--credit-steps 16] [--spread 12] [--lanes 2 1] [--deadline 25]
        [--long-kind credit|generate] [--long-steps 100] [--at-once N ...]

    # issue 26's case: 8 long Generate requests (100 steps, every model), then one 1-step Generate
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/app_bench.py --long-kind generate --long 8 --clients 9 --steps 1 \
        --long-steps 100 --spread 0 --lanes 2 --at-once 16 1 --runs 4 --deadline 200

The server process loads one app per `--lanes` value (base + `--runs` fake fine-tuned models, `app.fake_runs`),
each on its own port (and one per `--at-once` value: how many Generate requests the app admits at once, 1 being
first come first served). Then, one app at a time, every client builds its `gradio_client.Client`, all start together,
the `--long` clients submit one Credit strip each at `--credit-steps` (with `--long-kind generate`: one Generate
request each at `--long-steps`) and the others, starting evenly over `--spread`
seconds (users do not all click at once; 0: all together), send `--requests` Generate requests each, one after the
other (every model at `--steps`). It reports the median and worst answer time of the short requests
that overlapped a long one, next to one short request on the idle server. `lanes=2` is the app's design (credit on
its own copy of the networks, in its own Gradio concurrency group); `lanes=1` is the old one (one queue, one job at
a time). Everything is bounded: the number of requests, `--deadline` seconds per app (an unanswered request counts
as answered at the deadline and is reported), and the server process is stopped at the end.

    # memory under repeated requests: the server's resident memory after each batch of requests (issue 52)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/app_bench.py --memory 8 --batch 40 --steps 1 --max-prompts 64 1000000

With `--memory B`, one app per `--max-prompts` value (prompt encodings each network keeps; 1000000: unbounded, as
before) answers B batches of `--batch` Generate requests, every model, each with a prompt it has not seen (the task's
train and evaluation prompts, in turn), and the table shows the server's RSS after each batch and the gallery files
on disk: a bounded app levels off. Measured (AMD EPYC, 2 logical CPUs shared with other jobs; base + 2 fake tiny
models, 1 step; RSS of the server process in MB, gallery files on disk capped by MAX_FILES = 256 plus the last answer):

| requests | RSS, max_prompts=64 | files | RSS, max_prompts=1000000 | files |
|---|---|---|---|---|
| 0 | 682 | 0 | 747 | 0 |
| 40 | 737 | 120 | 753 | 123 |
| 80 | 738 | 240 | 755 | 243 |
| 120 | 739 | 259 | 757 | 259 |
| 160 | 739 | 259 | 758 | 259 |
| 200 | 742 | 259 | 759 | 259 |
| 240 | 742 | 259 | 759 | 259 |
| 280 | 742 | 259 | 759 | 259 |
| 320 | 742 | 259 | 760 | 259 |

The tiny model's prompt encodings are small, so both level off within ~5 MB after the first 120 requests; the bound
matters for SD3.5, where one prompt's T5 encoding is ~5 MB."""
import argparse, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time
from pathlib import Path
os.environ.setdefault('GRADIO_ANALYTICS_ENABLED', 'False')

def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def server(out:str, n_runs:int, variants:list[tuple[int, int]], ports:list[int], max_prompts:int|None=None):
    """The server process: a fake runs folder, one app per (lanes, Generate requests at once), each on its port, until
    stdin closes."""
    import torch
    torch.set_num_threads(1)
    from flowgrpo_nb import app as app_mod
    from flowgrpo_nb.bank import fake_runs
    from flowgrpo_nb.app import make_app, serve
    runs = fake_runs(Path(out)/'compare', methods=('flow_grpo', 'dense', 'stepwise', 'turning_point')[:n_runs])
    if max_prompts: app_mod.MAX_PROMPTS = max_prompts  # read by forget_prompts at each request
    apps = []
    for lanes, at_once in variants:
        app_mod.GENERATE_AT_ONCE = at_once  # read by make_app
        apps.append(make_app(runs, lanes=lanes))
    for app, port in zip(apps, ports): serve(app, port=port, block=False, quiet=True)
    print('ready', flush=True)
    sys.stdin.read()
    for app in apps: app.close(verbose=False)

def start_server(out:Path, n_runs:int, variants:list[tuple[int, int]], timeout:float,
                 max_prompts:int=0) -> tuple[subprocess.Popen, dict]:
    ports = [free_port() for _ in variants]
    proc = subprocess.Popen([sys.executable, __file__, '--serve', str(out), '--runs', str(n_runs), '--max-prompts',
                             str(max_prompts), '--lanes', *(str(l) for l, _ in variants), '--at-once',
                             *(str(n) for _, n in variants), '--ports', *map(str, ports)],
                            env=os.environ | dict(OMP_NUM_THREADS='1'), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start(); reader.join(timeout)
    if not line or line[0].strip() != 'ready':
        proc.kill()
        raise SystemExit(f'the server process did not start within {timeout} s (exit status {proc.poll()})')
    return proc, dict(zip(variants, ports))

def load(url:str, a) -> dict:
    "Run the mixed clients against `url`; the answer times of short and long requests."
    from gradio_client import Client
    prompts = ['a red circle', 'three squares', 'a cross left of a circle', 'a blue square and a yellow triangle']
    idle = Client(url, verbose=False)
    idle_s = []
    for i in range(2):
        t = time.perf_counter(); idle.predict(prompts[i], i, a.steps, 4.0, 'ode', api_name='/generate')
        idle_s.append(time.perf_counter() - t)
    shorts, longs, errors, lock = [], [], [], threading.Lock()
    ready = threading.Barrier(a.clients + 1)
    def client(i):
        c = Client(url, verbose=False)
        ready.wait()
        t_end = time.perf_counter() + a.deadline
        kind = 'long' if i < a.long else 'short'
        # after the long ones, spread out
        if kind == 'short': time.sleep(0.5 + a.spread * (i - a.long) / (a.clients - a.long))
        for r in range(1 if kind == 'long' else a.requests):
            t = time.perf_counter()
            if kind == 'long' and a.long_kind == 'generate':
                job = c.submit(prompts[i % 4], i, a.long_steps, 4.0, 'ode', api_name='/generate')
            elif kind == 'long':
                job = c.submit(prompts[i % 4], 'base', i, a.credit_steps, 4.0, 'flow_sde', api_name='/credit')
            else: job = c.submit(prompts[(i + r) % 4], i * 10 + r, a.steps, 4.0, 'ode', api_name='/generate')
            try:
                out = job.result(timeout=max(0.1, t_end - time.perf_counter()))
                ok = 'Invalid' not in out[0] and 'Error' not in out[0]
            except Exception as e: ok = False; errors.append(f'{kind}: {type(e).__name__}')
            with lock: (longs if kind == 'long' else shorts).append((t, time.perf_counter() if ok else t_end, ok))
            if time.perf_counter() >= t_end: break
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
    for th in threads: th.start()
    ready.wait(); t0 = time.perf_counter()
    for th in threads: th.join(a.deadline + 30)
    during = [e - s for s, e, _ in shorts if any(s < le and e > ls for ls, le, _ in longs)]
    return dict(idle=statistics.median(idle_s), short_n=len(shorts), during_n=len(during),
                short_median=statistics.median(during) if during else float('nan'),
                short_worst=max(during, default=float('nan')),
                long_median=statistics.median([e - s for s, e, _ in longs]), long_worst=max(e - s for s, e, _ in longs),
                unanswered=sum(not ok for *_, ok in shorts + longs), wall=time.perf_counter() - t0,
                errors=sorted(set(errors)))

def rss_mb(pid:int) -> float:
    "Resident memory of process `pid` in MB (Linux)."
    return next(int(l.split()[1]) for l in Path(f'/proc/{pid}/status').read_text().splitlines()
                if l.startswith('VmRSS')) / 1024

def memory(a) -> None:
    """The server's RSS after each of `a.memory` batches of `a.batch` Generate requests with new prompts, per
    --max-prompts."""
    from gradio_client import Client
    from flowgrpo_nb.task import load_task
    task = load_task('partial', None, None, 'tiny')
    prompts = list(dict.fromkeys([*task.train_prompts, *task.eval_prompts]))
    cols = {}
    for keep in a.max_prompts:
        tmp = Path(tempfile.mkdtemp(prefix='app-bench-'))
        env = os.environ.get('GRADIO_TEMP_DIR')
        os.environ['GRADIO_TEMP_DIR'] = str(tmp/'gradio')  # the server's gallery files, counted below
        try:
            proc, ports = start_server(tmp, a.runs, [(2, 16)], 180, keep)
        finally:
            if env is None: os.environ.pop('GRADIO_TEMP_DIR')
            else: os.environ['GRADIO_TEMP_DIR'] = env
        try:
            c, rows, i = Client(f'http://127.0.0.1:{ports[2, 16]}/', verbose=False), [], 0
            rows.append((0, rss_mb(proc.pid), 0))
            for b in range(a.memory):
                for _ in range(a.batch):
                    c.predict(prompts[i % len(prompts)], i, a.steps, 4.0, 'ode', api_name='/generate'); i += 1
                rows.append((i, rss_mb(proc.pid), sum(1 for f in (tmp/'gradio').rglob('*') if f.is_file())))
                print(f'max_prompts={keep}: {i} requests, RSS {rows[-1][1]:.0f} MB, {rows[-1][2]} files', flush=True)
            cols[keep] = rows
        finally:
            proc.stdin.close()
            try: proc.wait(60)
            except subprocess.TimeoutExpired: proc.kill()
            shutil.rmtree(tmp, ignore_errors=True)
    keeps = list(cols)
    print('\n| requests | ' + ' | '.join(f'RSS (MB), max_prompts={k} | files on disk' for k in keeps) + ' |')
    print('|---' * (1 + 2 * len(keeps)) + '|')
    for r in range(a.memory + 1):
        print(f'| {cols[keeps[0]][r][0]} | ' + ' | '.join(f'{cols[k][r][1]:.0f} | {cols[k][r][2]}' for k in keeps)
              + ' |')

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--clients', type=int, default=20)
    ap.add_argument('--long', type=int, default=3)           # clients that send one Credit strip each
    ap.add_argument('--requests', type=int, default=1)       # Generate requests per short client
    ap.add_argument('--runs', type=int, default=2)           # fine-tuned models next to the base (at most 4)
    ap.add_argument('--steps', type=int, default=4)
    ap.add_argument('--credit-steps', type=int, default=16)
    ap.add_argument('--lanes', type=int, nargs='+', default=[2, 1])
    ap.add_argument('--long-kind', choices=('credit', 'generate'), default='credit')  # what the long clients send
    ap.add_argument('--long-steps', type=int, default=100)  # steps of a long Generate request (--long-kind generate)
    # Generate requests admitted at once (default: the app's)
    ap.add_argument('--at-once', type=int, nargs='+', default=None)
    ap.add_argument('--spread', type=float, default=12.0)    # the short clients start evenly over this many seconds
    ap.add_argument('--deadline', type=float, default=25.0)  # seconds of load per app
    # batches of requests of the memory benchmark (0: the load one)
    ap.add_argument('--memory', type=int, default=0)
    ap.add_argument('--batch', type=int, default=40)        # Generate requests per batch (--memory)
    # prompt encodings kept per network (0: the app's)
    ap.add_argument('--max-prompts', type=int, nargs='+', default=[0])
    ap.add_argument('--serve', help=argparse.SUPPRESS)       # internal: run as the server process on this runs folder
    ap.add_argument('--ports', type=int, nargs='+', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve: return server(a.serve, a.runs, list(zip(a.lanes, a.at_once)), a.ports, a.max_prompts[0])
    if a.memory: return memory(a)
    from flowgrpo_nb.app import GENERATE_AT_ONCE
    variants = [(l, n) for l in a.lanes for n in (a.at_once or [GENERATE_AT_ONCE])]
    if not 0 < a.long < a.clients:
        raise SystemExit(f'--long {a.long}: allowed 1..{a.clients - 1} (some clients must be short)')
    if not 1 <= a.runs <= 4: raise SystemExit(f'--runs {a.runs}: allowed 1..4')
    tmp = Path(tempfile.mkdtemp(prefix='app-bench-'))
    t_start = time.perf_counter()
    proc, ports = start_server(tmp, a.runs, variants, 180)
    rows = {}
    try:
        long = (f'Credit at {a.credit_steps} steps' if a.long_kind == 'credit'
                else f'Generate at {a.long_steps} steps ({a.runs + 1} models)')
        print(f'server up in {time.perf_counter() - t_start:.0f} s; {a.clients} clients: {a.long} x {long}, '
              f'{a.clients - a.long} x {a.requests} Generate ({a.runs + 1} models, {a.steps} steps)', flush=True)
        for v, port in ports.items(): rows[v] = load(f'http://127.0.0.1:{port}/', a)
    finally:
        proc.stdin.close()
        try: proc.wait(60)
        except subprocess.TimeoutExpired: proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print('\n| lanes | Generate at once | short alone (s) | short during long: n | median (s) | worst (s) '
          '| long median (s) | long worst (s) | unanswered | wall (s) |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for (lanes, at_once), r in rows.items():
        print(f"| {lanes} | {at_once} | {r['idle']:.2f} | {r['during_n']}/{r['short_n']} | {r['short_median']:.2f} | "
              f"{r['short_worst']:.2f} | {r['long_median']:.1f} | {r['long_worst']:.1f} | {r['unanswered']} "
              f"| {r['wall']:.0f} |" + (f" {r['errors']}" if r['errors'] else ''))
    print(f'\ntotal {time.perf_counter() - t_start:.0f} s')

if __name__ == '__main__': main()
