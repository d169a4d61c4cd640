"""`flowgrpo COMMAND --help` and a malformed option answer from the parsers kept in flowgrpo_nb/assets/cli.json,
without importing the command's module: the kept parsers must be the real ones."""
import subprocess, sys

import pytest

from flowgrpo_nb import cli

STALE = 'flowgrpo_nb/assets/cli.json is behind the source: run `python tools/cli_help.py` and commit it'


@pytest.mark.parametrize('name', list(cli.COMMANDS))
def test_kept_parser_is_the_real_one(name):
    kept = cli._kept_parser(name)
    assert kept is not None, f'{name}: {STALE} (its options changed)'
    real = cli._parser(name, cli._command(name))
    assert kept.format_help() == real.format_help(), f'{name}: {STALE} (its --help text changed)'
    assert cli.parser_spec(kept) == cli.parser_spec(real), f'{name}: {STALE}'


RUN = ("import sys\nfrom flowgrpo_nb.cli import main\n"
       "try: main(sys.argv[1:])\nexcept SystemExit as e: print('exit', e.code, 'torch' in sys.modules)")

@pytest.mark.parametrize('args,status', [(['train', '--help'], 0), (['train', '--bogus'], 2),
                                         (['compare', '-h'], 0), (['app', '--port'], 2)])
def test_help_and_malformed_options_do_not_import_torch(args, status):
    r = subprocess.run([sys.executable, '-c', RUN, *args], capture_output=True, text=True, timeout=120)
    assert r.stdout.splitlines()[-1] == f'exit {status} False', r.stdout[-2000:] + r.stderr[-2000:]
    if status == 2: assert 'Traceback' not in r.stderr and 'error:' in r.stderr, r.stderr
    else: assert 'usage: flowgrpo' in r.stdout
