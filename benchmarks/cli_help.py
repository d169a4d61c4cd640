"""Benchmark of `flowgrpo COMMAND --help` and of a malformed option (not a test): each a fresh process, as a user
starts it, timed wall and CPU (user + system of the child), the median of `--repeat` runs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cli_help.py [--repeat 3] [--commands train compare app]

Rows: `kept`, what `flowgrpo` does now (the parser rebuilt from flowgrpo_nb/assets/cli.json, the command's module not
imported); `built`, the parser built from the command's module (what every `--help` did before the kept parsers, and
what it still does when the kept entry is stale). Run from the checkout's root; it times this checkout's package."""
import argparse, os, resource, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEPT = "import sys\nfrom flowgrpo_nb.cli import main\nsys.exit(main(sys.argv[1:]))"
BUILT = ("import sys\nfrom flowgrpo_nb import cli\nname, *args = sys.argv[1:]\n"
         "p = cli._parser(name, cli._command(name))\n"
         "print(p.format_help()) if '--help' in args else p.parse_args(args)")

def timed(code:str, args:list[str]) -> tuple[float, float, int]:
    "Wall and CPU seconds of one child running `code` with `args`, and its exit status."
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run([sys.executable, '-c', code, *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'})
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.returncode

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--repeat', type=int, default=3)
    ap.add_argument('--commands', nargs='+', default=['train', 'compare', 'app'])
    a = ap.parse_args()
    print(f'{sys.platform}, {os.cpu_count()} logical CPUs, {a.repeat} runs each (median)\n')
    print('| command line | path | wall s | CPU s | status |\n|---|---|---:|---:|---:|')
    for name in a.commands:
        for args in ([name, '--help'], [name, '--no-such-flag']):
            for path, code in (('kept', KEPT), ('built', BUILT)):
                runs = [timed(code, args) for _ in range(a.repeat)]
                print(f"| flowgrpo {' '.join(args)} | {path} | {statistics.median(r[0] for r in runs):.2f} | "
                      f"{statistics.median(r[1] for r in runs):.2f} | {runs[-1][2]} |", flush=True)

if __name__ == '__main__': main()
