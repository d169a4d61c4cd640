"Docs checks that need no Quarto: the notebooks go through nbdev's processors, and README.md is in sync with nbs/index.ipynb."
import re, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT/'.venv'/'bin'

def _bin(name): return str(BIN/name) if (BIN/name).exists() else shutil.which(name) or name

def test_proc_nbs(tmp_path):
    """`nbdev-proc-nbs` (the step before Quarto in `nbdev-docs`) processes every notebook, tutorials included; on a copy
    of the notebooks and settings, so that it writes nothing in the tree (the browser test checks the tree meanwhile)."""
    shutil.copytree(ROOT/'nbs', tmp_path/'nbs', ignore=shutil.ignore_patterns('.ipynb_checkpoints'))
    shutil.copy(ROOT/'pyproject.toml', tmp_path/'pyproject.toml')
    r = subprocess.run([_bin('nbdev-proc-nbs')], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    proc = tmp_path/'_proc'
    for nb in ('index.ipynb', '07_viz.ipynb', 'tutorials/quickstart.ipynb', 'tutorials/sd3.ipynb'):
        if (ROOT/'nbs'/nb).exists(): assert (proc/nb).exists(), f"nbdev-proc-nbs did not write _proc/{nb}"
    assert (proc/'_quarto.yml').exists()

def _readme_from_index(tmp_path) -> str:
    "What `python tools/readme.py` writes, run on a copy so the repo's README.md is never touched."
    for p in ('tools', 'nbs/index.ipynb', 'pyproject.toml'):
        src, dst = ROOT/p, tmp_path/p
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    (tmp_path/'flowgrpo_nb').mkdir()
    shutil.copy(ROOT/'flowgrpo_nb'/'__init__.py', tmp_path/'flowgrpo_nb'/'__init__.py')
    r = subprocess.run([sys.executable, str(tmp_path/'tools'/'readme.py')], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return (tmp_path/'README.md').read_text()

def test_readme_in_sync(tmp_path):
    assert (ROOT/'README.md').read_text() == _readme_from_index(tmp_path), \
        "README.md differs from nbs/index.ipynb: run `python tools/readme.py`"

def test_readme_has_the_two_commands():
    "The index notebook's two shell commands (set up, test) appear in README.md."
    import json
    src = '\n'.join(''.join(c['source']) for c in json.loads((ROOT/'nbs'/'index.ipynb').read_text())['cells'])
    blocks = re.findall(r'```(?:sh|bash)\n(.*?)```', src, flags=re.S)
    cmds = [l.strip() for b in blocks for l in b.splitlines() if l.strip() and not l.strip().startswith('#')]
    assert 'bash tools/main.sh' in cmds and 'bash tools/test.sh' in cmds, cmds
    readme = (ROOT/'README.md').read_text()
    for c in ('bash tools/main.sh', 'bash tools/test.sh'): assert c in readme, f"{c!r} is not in README.md"

def test_readme_first_screen():
    "The README's first screen: the commands, where results land, how to open them, then the study's verdicts; the quick job's findings folded."
    lines = (ROOT/'README.md').read_text().splitlines()
    top = '\n'.join(lines[:45])
    for s in ('bash tools/env.sh', 'bash tools/main.sh', 'runs/compare/report.html', 'flowgrpo app --runs runs/compare',
              'claims tested', 'glossary.ipynb'):
        assert s in top, f"{s!r} is not in the README's first 45 lines"
    readme = '\n'.join(lines)
    assert '<details><summary>' in readme and '</details>' in readme, "the quick comparison's findings are not folded"
