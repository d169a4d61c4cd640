"""Write flowgrpo_nb/assets/cli.json: every command's parser as data, so that `flowgrpo COMMAND --help` and a malformed
option answer without importing the command's module (torch, diffusers, peft). Run it after changing a command's
options, a config field, a method's summary or a preset; tests/test_cli_help.py says when it is due.
Usage: python tools/cli_help.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package, not an installed one
from flowgrpo_nb.cli import write_cli_help

if __name__ == '__main__': print(f'wrote {write_cli_help()}')
