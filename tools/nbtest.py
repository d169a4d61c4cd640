"""`nbdev-test` on many notebooks, each in a fresh process, without paying the heavy imports once per notebook.

One process imports the libraries nearly every notebook imports (torch, diffusers, peft and transformers, accelerate,
plotly, pandas: about 8 CPU seconds here), then forks a child per notebook that runs `nbdev_test` on it exactly as the
`nbdev-test NB` command does (the project's settings, its skip flags, `--flags`). A child never runs a second
notebook: each starts from the same freshly imported state, as a new `nbdev-test` process would, only sooner.

Prints one JSON line per notebook as it ends: {"nb", "ok", "seconds", "output"} (output: the child's stdout and stderr).
Usage: python tools/nbtest.py [--flags FLAGS] [--workers N] NB.ipynb ... (tools/check.py runs it)."""
import argparse, json, os, sys, tempfile, time
from pathlib import Path

os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ['PYTHONUNBUFFERED'] = '1'
PRELOAD = ('torch', 'safetensors.torch', 'diffusers', 'peft', 'transformers', 'accelerate', 'plotly.graph_objects',
           'pandas', 'nbdev.test', 'execnb.shell')


def preload():
    "Import `PRELOAD` (what a notebook's first cells import anyway); a library missing here is left to the notebook."
    import importlib
    for m in PRELOAD:
        try: importlib.import_module(m)
        except ImportError: pass


def test_one(nb:str, flags:str, result:str):
    """In a forked child: `nbdev_test` on one notebook, its stdout and stderr captured (file descriptors included);
    (ok, seconds, output) written as JSON to `result`."""
    t = time.time()
    with tempfile.TemporaryFile() as f:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(f.fileno(), 1); os.dup2(f.fileno(), 2)
        try:
            from nbdev.test import nbdev_test
            nbdev_test(path=nb, flags=flags)
            ok = True
        except SystemExit as e: ok = not e.code
        except BaseException:
            import traceback; traceback.print_exc(); ok = False
        sys.stdout.flush(); sys.stderr.flush()
        f.seek(0)
        out = f.read().decode(errors='replace')
    Path(result).write_text(json.dumps(dict(ok=ok, seconds=time.time() - t, output=out)))


def run_all(notebooks:list, flags:str='', workers:int=2):
    """Yield (notebook, ok, seconds, output) for each notebook as it ends, `workers` children at a time (not
    daemonic: a notebook may start processes of its own)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx, todo, running = mp.get_context('fork'), list(notebooks), {}
    with tempfile.TemporaryDirectory() as tmp:
        while todo or running:
            while todo and len(running) < workers:
                nb = todo.pop(0)
                res = Path(tmp)/f'{len(todo)}.json'
                p = ctx.Process(target=test_one, args=(str(nb), flags, str(res)))
                p.start()
                running[p.sentinel] = (p, nb, res, time.time())
            for s in wait(list(running)):
                p, nb, res, t = running.pop(s)
                p.join()
                try: r = json.loads(res.read_text())
                except (OSError, ValueError):
                    r = dict(ok=False, seconds=time.time() - t, output=f'its process died (exit code {p.exitcode})')
                yield nb, r['ok'] and p.exitcode == 0, r['seconds'], r['output']


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('notebooks', nargs='+')
    ap.add_argument('--flags', default='', help='test flags to run that are normally skipped')
    ap.add_argument('--workers', type=int, default=2)
    a = ap.parse_args(argv)
    preload()
    for nb, ok, secs, out in run_all(a.notebooks, a.flags, a.workers):
        print(json.dumps(dict(nb=str(nb), ok=ok, seconds=secs, output=out)), flush=True)


if __name__ == '__main__': main()
