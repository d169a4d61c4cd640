"The import graph: the method side never imports the grid world, and every notebook imports only from notebooks before it."
import ast, json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT/'flowgrpo_nb'
WORLD = {'world', 'tiny', 'score'}
METHOD_SIDE = ('rollout', 'credit', 'config', 'train', 'stats', 'design', 'fidelity', 'results', 'summary', 'figures', 'report', 'compare', 'fidelity_report', 'app')

def imported_modules(path:Path) -> set[str]:
    "Package modules a source file imports anywhere (top level or inside functions)."
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ''
            if node.level == 1: out.add(mod.split('.')[0] if mod else '')
            elif mod.startswith('flowgrpo_nb.'): out.add(mod.split('.')[1])
            elif mod == 'flowgrpo_nb': out |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split('.')[1] for a in node.names if a.name.startswith('flowgrpo_nb.')}
    return out - {''}

@pytest.mark.parametrize('module', METHOD_SIDE)
def test_method_side_does_not_import_the_grid_world(module):
    assert not imported_modules(PKG/f'{module}.py') & WORLD, imported_modules(PKG/f'{module}.py') & WORLD

def notebook_modules() -> dict[str, str]:
    "{module: notebook file name} from each numbered notebook's default_exp."
    out = {}
    for nb in sorted((ROOT/'nbs').glob('[0-9]*.ipynb')):
        src = ''.join(''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code')
        m = re.search(r'#\|\s*default_exp\s+(\w+)', src)
        if m: out[m.group(1)] = nb.name
    return out

def test_notebooks_import_only_from_lower_numbers():
    mods = notebook_modules()
    bad = [(mods[m], mods[dep]) for m in mods for dep in imported_modules(PKG/f'{m}.py') if dep in mods and mods[dep] >= mods[m]]
    assert not bad, f'notebooks importing from later (or the same) notebooks: {bad}'

def _deps(module:str) -> set[str]:
    "The package modules `module` imports, directly or through the modules it imports."
    out, todo = set(), [module]
    while todo:
        for dep in imported_modules(PKG/f'{todo.pop()}.py') - out:
            if (PKG/f'{dep}.py').exists(): out.add(dep); todo.append(dep)
    return out

RENDERING = ('figures', 'report')  # a report's figures and words: they read a `Report` and nothing that runs or trains
TRAINING_OR_RUNNING = {'train', 'compare', 'fidelity', 'fidelity_report', 'app', 'cli'}

@pytest.mark.parametrize('module', RENDERING)
def test_rendering_imports_no_process_or_training_code(module):
    "No training or running code, however indirectly; no child processes of its own (the PNG export is the running side's)."
    assert not _deps(module) & TRAINING_OR_RUNNING, _deps(module) & TRAINING_OR_RUNNING
    assert 'processes' not in imported_modules(PKG/f'{module}.py')

def imports_of(path:Path) -> set[str]:
    "Top-level names of every module a source file imports (third-party ones included)."
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module: out.add(node.module.split('.')[0])
        elif isinstance(node, ast.Import): out |= {a.name.split('.')[0] for a in node.names}
    return out

STATISTICS = {'stats'}  # the one home of the statistics (tests, intervals, corrections, power, the clustered bootstrap)

@pytest.mark.parametrize('module', sorted({*METHOD_SIDE, 'design', 'results', 'summary', *RENDERING} - STATISTICS))
def test_statistics_have_one_home(module):
    "Only the statistics module uses scipy's statistics; the comparison, fidelity and rendering go through it."
    src = PKG/f'{module}.py'
    assert 'scipy' not in imports_of(src), f'{module} imports scipy: its statistics belong in stats'
    defs = {n.name for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.FunctionDef)}
    assert not defs & {'holm', 'paired', 'aggregate', 'one_sided', 'tost', 'mde', 'power', 'cluster_draws', 'boot_stats', 'percentile_ci'}

MAX_LINES = 520  # about 500 lines a module, the largest of the core notebooks' size

@pytest.mark.parametrize('path', sorted(p.name for p in PKG.glob('*.py') if p.name not in ('_modidx.py', '__init__.py')))
def test_modules_stay_small(path):
    n, most = len((PKG/path).read_text().splitlines()), MAX_LINES
    assert n <= most, f'{path} has {n} lines (at most {most}): split its notebook along a seam'

def test_wheel_builds_without_warnings_and_ships_the_assets(tmp_path):
    "pyproject.toml's packaging: no setuptools warning (flowgrpo_nb.assets is listed), the shipped weights inside the wheel."
    import subprocess, sys, zipfile
    files = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard'], cwd=ROOT, capture_output=True, text=True).stdout.split()
    src = tmp_path/'src'
    for f in files:
        if (ROOT/f).is_file(): (src/f).parent.mkdir(parents=True, exist_ok=True); (src/f).write_bytes((ROOT/f).read_bytes())
    r = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-w', str(tmp_path/'whl'), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'Warning' not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    names = zipfile.ZipFile(next((tmp_path/'whl').glob('*.whl'))).namelist()
    assert {'flowgrpo_nb/assets/tiny.safetensors', 'flowgrpo_nb/assets/tiny.json', 'flowgrpo_nb/display.py'} <= set(names)

def test_clean_keeps_every_notebooks_kernelspec(tmp_path):
    """`nbdev-clean` (run on a copy of nbs/ and the settings) leaves every notebook, tutorials included, a Python 3
    kernelspec: the docs build and `nbdev-test` start the kernel it names."""
    import shutil, subprocess, sys
    shutil.copytree(ROOT/'nbs', tmp_path/'nbs', ignore=shutil.ignore_patterns('.ipynb_checkpoints'))
    shutil.copy(ROOT/'pyproject.toml', tmp_path/'pyproject.toml')
    clean = Path(sys.executable).parent/'nbdev-clean'
    r = subprocess.run([str(clean) if clean.exists() else 'nbdev-clean'], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    nbs = sorted((tmp_path/'nbs').rglob('*.ipynb'))
    assert len(nbs) == len([p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts])
    assert any(p.parent.name == 'tutorials' for p in nbs)
    missing = [p.relative_to(tmp_path/'nbs').as_posix() for p in nbs
               if json.loads(p.read_text()).get('metadata', {}).get('kernelspec', {}).get('name') != 'python3']
    assert not missing, f'no python3 kernelspec after nbdev-clean: {missing}'
