"What the committed files record: no path of the machine that wrote them; every claim of a study's report read both ways."
import json, re, subprocess, tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

def machine_folders() -> list[str]:
    "The folders of this machine a record could name: the checkout's top folder, the home and temporary folders."
    tops = {'/' + ROOT.parts[1], str(Path.home()), tempfile.gettempdir(), '/home'}
    return sorted(t.rstrip('/') for t in tops if t not in ('/', ''))

def absolute_paths(text:str, folders:list[str]) -> list[str]:
    "The paths under `folders` that `text` names (a path, not a word that ends with one: `a/tmp/b` is not one)."
    pat = r'(?<![\w.~/-])(?:' + '|'.join(map(re.escape, folders)) + r')/[^\s"\'`<>)\\]*'
    return re.findall(pat, text)

def test_absolute_paths_found():
    f = ['/work', '/tmp', '/root']
    test = absolute_paths('"command": "flowgrpo compare --out /work/credit", "c": "x/tmp/y", "d": "~/tmp/z"', f)
    assert test == ['/work/credit']
    assert absolute_paths('"checkpoint": "checkpoints/ckpt-000100", "compare": ".."', f) == []
    assert absolute_paths("--json /tmp/phases.json", f) == ['/tmp/phases.json']

def test_no_committed_file_names_a_folder_of_this_machine():
    folders = machine_folders()
    ere = r'(^|[^A-Za-z0-9_.~/-])(' + '|'.join(re.escape(f) for f in folders) + ')/'
    # git grep reads the tracked files (text only, -I) quickly; each file it names is read again here
    hits = subprocess.run(['git', '-C', str(ROOT), 'grep', '-I', '-l', '-E', ere], capture_output=True, text=True)
    assert hits.returncode in (0, 1), hits.stderr
    bad = {f: found[:2] for f in hits.stdout.split() if (found := absolute_paths((ROOT/f).read_text(), folders))}
    assert not bad, f"{len(bad)} committed files name a folder of this machine ({', '.join(folders)}): {bad}"
