"""The house's layout: two wings (the library below, the study above it), one direction of imports, notebooks that
import only from notebooks before them in their wing, lines a reader sees whole and modules sized by their purpose."""
import ast, json, re, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT/'flowgrpo_nb'
WORLD = {'world', 'worlds', 'tiny', 'score'}
MOST_LINES, WIDTH = 600, 120

def module_name(path:Path) -> str:
    "'train' for flowgrpo_nb/train.py, 'study.design' for flowgrpo_nb/study/design.py."
    return '.'.join(path.relative_to(PKG).with_suffix('').parts)

MODULES = {module_name(p): p for p in sorted(PKG.rglob('*.py')) if p.name not in ('_modidx.py', '__init__.py')}
LIBRARY = sorted(m for m in MODULES if not m.startswith('study.'))
STUDY = sorted(m for m in MODULES if m.startswith('study.'))

def imported_modules(path:Path) -> set[str]:
    "Package modules a source file imports anywhere (top level or inside functions), as 'train' or 'study.design'."
    here, out = module_name(path).split('.')[:-1], set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                mod = '.'.join(base + ([node.module] if node.module else []))
                out |= {mod} if node.module else {'.'.join(base + [a.name]) for a in node.names}
            elif (node.module or '').startswith('flowgrpo_nb.'): out.add(node.module.removeprefix('flowgrpo_nb.'))
            elif node.module == 'flowgrpo_nb': out |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix('flowgrpo_nb.') for a in node.names if a.name.startswith('flowgrpo_nb.')}
    return {m for m in out if m in MODULES}

GRAPH = {m: imported_modules(p) for m, p in MODULES.items()}

def test_the_library_never_imports_the_study():
    "No arrow from a library module to the study, however written (relative, absolute, inside a function)."
    up = {m: sorted(d for d in GRAPH[m] if d.startswith('study.')) for m in LIBRARY}
    assert not {m: d for m, d in up.items() if d}, up

def test_the_study_uses_the_library():
    assert any(d in LIBRARY for m in STUDY for d in GRAPH[m])

def test_the_import_graph_has_no_circle():
    seen, done = set(), set()
    def visit(m, path):
        assert m not in seen or m in done, f"import circle: {' -> '.join(path + [m])}"
        if m in done: return
        seen.add(m)
        for d in GRAPH[m]: visit(d, path + [m])
        done.add(m)
    for m in MODULES: visit(m, [])

def test_the_library_reads_no_file_of_the_repository():
    "A library module finds no file above the package (results/, design/, benchmarks/): the study is given its files."
    for m in LIBRARY:
        src = MODULES[m].read_text()
        assert not re.search(r"parent\.parent|['\"](results|design|benchmarks)/", src), m

METHOD_SIDE = ('rollout', 'credit', 'config', 'tempflow', 'flash', 'collect', 'train', 'update', 'app', *STUDY)

@pytest.mark.parametrize('module', METHOD_SIDE)
def test_method_side_does_not_import_the_grid_world(module):
    assert not GRAPH[module] & WORLD, GRAPH[module] & WORLD

# a method is one entry (`method.Method`): only the methods' own modules name methods to decide what to do
METHOD_MODULES = ('method', 'collect', 'credit', 'tempflow', 'flash')
DISPATCH = re.compile(r"""method\s*[!=]=\s*['"]|method\s+(?:not\s+)?in\s*(?:[(\[{]\s*['"]|[A-Z_]*METHODS\b)""")

def test_dispatch_pattern_finds_what_it_forbids():
    hits = ["if cfg.method == 'tempflow':", "cfg.method != 'flash'", "c.method in ('dense', 'turning_point')",
            "run.method not in FIDELITY_METHODS", "method in ['a']", "self.cfg.method in ROLLOUT_METHODS"]
    misses = ["method=cfg.method", "method_of(cfg.method).fidelity == 'branches'", "for m in METHODS:"]
    assert all(DISPATCH.search(h) for h in hits) and not any(DISPATCH.search(m) for m in misses)

@pytest.mark.parametrize('module', sorted(set(MODULES) - set(METHOD_MODULES)))
def test_no_string_dispatch_on_the_method(module):
    "Outside the methods' own modules, code asks the method's entry (`method_of`), never tests its name."
    lines = MODULES[module].read_text().splitlines()
    found = [f'{module}:{i}: {line.strip()}' for i, line in enumerate(lines, 1) if DISPATCH.search(line)]
    assert not found, found

def notebook_modules() -> dict[str, Path]:
    "{module: notebook} from each numbered notebook's default_exp, the study's under nbs/study/."
    out = {}
    for nb in sorted([*(ROOT/'nbs').glob('[0-9]*.ipynb'), *(ROOT/'nbs'/'study').glob('[0-9]*.ipynb')]):
        src = ''.join(''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code')
        if m := re.search(r'#\|\s*default_exp\s+([\w.]+)', src): out[m.group(1)] = nb
    return out

def test_every_module_has_its_notebook_in_its_wing():
    mods = notebook_modules()
    assert set(mods) == set(MODULES), set(mods) ^ set(MODULES)
    assert all((mods[m].parent.name == 'study') == m.startswith('study.') for m in mods)

def test_notebooks_import_only_from_lower_numbers():
    "Within a wing, a notebook imports from notebooks before it; the study imports any of the library."
    mods = notebook_modules()
    bad = [(mods[m].name, mods[d].name) for m in mods for d in GRAPH[m]
           if mods[d].parent == mods[m].parent and mods[d].name >= mods[m].name]
    assert not bad, f'notebooks importing from later (or the same) notebooks: {bad}'

def _deps(module:str) -> set[str]:
    "The package modules `module` imports, directly or through the modules it imports."
    out, todo = set(), [module]
    while todo:
        for dep in GRAPH[todo.pop()] - out: out.add(dep); todo.append(dep)
    return out

# a report's figures and words: they read a `Report`, nothing that runs
RENDERING = ('study.figures', 'study.report', 'study.page', 'study.document')
TRAINING_OR_RUNNING = {'train', 'study.compare', 'study.fidelity', 'study.fidelity_report', 'study.pool', 'app', 'cli'}

@pytest.mark.parametrize('module', RENDERING)
def test_rendering_imports_no_process_or_training_code(module):
    assert not _deps(module) & TRAINING_OR_RUNNING, _deps(module) & TRAINING_OR_RUNNING
    assert 'processes' not in GRAPH[module]

def imports_of(path:Path) -> set[str]:
    "Top-level names of every module a source file imports (third-party ones included)."
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module: out.add(node.module.split('.')[0])
        elif isinstance(node, ast.Import): out |= {a.name.split('.')[0] for a in node.names}
    return out

STATISTICS = 'study.stats'  # the one home of the statistics (tests, intervals, corrections, power, the bootstrap)

@pytest.mark.parametrize('module', sorted(set(METHOD_SIDE) - {STATISTICS}))
def test_statistics_have_one_home(module):
    "Only the statistics module uses scipy's statistics; the comparison, fidelity and rendering go through it."
    src = MODULES[module]
    assert 'scipy' not in imports_of(src), f'{module} imports scipy: its statistics belong in {STATISTICS}'
    defs = {n.name for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.FunctionDef)}
    assert not defs & {'holm', 'paired', 'aggregate', 'one_sided', 'tost', 'mde', 'power', 'cluster_draws',
                       'boot_stats', 'percentile_ci'}

def test_no_line_is_wider_than_the_page():
    """ruff's E501 at 120 columns on the exported modules, on every notebook's code (ruff reads .ipynb itself) and on
    the Python files of tools/, tests/ and benchmarks/. nbdev writes each generated module's `__all__` itself, wrapping
    its names at 120 before the `__all__ = ` it puts in front: that one generated line is not ours to wrap."""
    r = subprocess.run([sys.executable, '-m', 'ruff', 'check', '--no-cache', '--select', 'E501', '--line-length',
                        str(WIDTH), '--exclude', '_modidx.py', '--output-format', 'json', 'flowgrpo_nb', 'nbs',
                        'tools', 'tests', 'benchmarks'],
                       cwd=ROOT, capture_output=True, text=True)
    found = json.loads(r.stdout or '[]')
    assert found or r.returncode == 0, r.stderr[-2000:]
    line = lambda e: Path(e['filename']).read_text().splitlines()[e['location']['row'] - 1]
    wide = [f"{Path(e['filename']).relative_to(ROOT)}:{e['location']['row']}" for e in found
            if not (e['filename'].endswith('.py') and line(e).startswith('__all__ = '))]
    assert not wide, f'{len(wide)} lines over {WIDTH} characters: {wide[:20]}'

@pytest.mark.parametrize('module', sorted(MODULES))
def test_modules_stay_the_size_of_one_purpose(module):
    "At most ~600 lines at 120 columns; the docstring's first sentence names one purpose (no 'and' joining two)."
    text = MODULES[module].read_text()
    assert len(text.splitlines()) <= MOST_LINES, \
        f'{module}: {len(text.splitlines())} lines: split its notebook along a seam'
    first = (ast.get_docstring(ast.parse(text)) or '').split('\n\n')[0]
    assert first, f'{module} has no docstring: its notebook needs a `>` summary line'
    assert not re.search(r'\band\b', first.split(':')[0]), f"{module}: its purpose reads as two: {first[:120]!r}"

def test_wheel_builds_without_warnings_and_ships_the_assets(tmp_path):
    "pyproject.toml's packaging: no setuptools warning, the shipped weights and the study inside the wheel."
    import zipfile
    files = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard'], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    src = tmp_path/'src'
    for f in files:
        if (ROOT/f).is_file():
            (src/f).parent.mkdir(parents=True, exist_ok=True); (src/f).write_bytes((ROOT/f).read_bytes())
    r = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-w',
                        str(tmp_path/'whl'), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'Warning' not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    names = zipfile.ZipFile(next((tmp_path/'whl').glob('*.whl'))).namelist()
    assert {'flowgrpo_nb/assets/tiny.safetensors', 'flowgrpo_nb/assets/tiny.json', 'flowgrpo_nb/display.py',
            'flowgrpo_nb/study/compare.py'} <= set(names)

def test_clean_keeps_every_notebooks_kernelspec(tmp_path):
    """`nbdev-clean` (run on a copy of nbs/ and the settings) leaves every notebook, tutorials and the study included, a
    Python 3 kernelspec: the docs build and `nbdev-test` start the kernel it names."""
    import shutil
    shutil.copytree(ROOT/'nbs', tmp_path/'nbs', ignore=shutil.ignore_patterns('.ipynb_checkpoints'))
    shutil.copy(ROOT/'pyproject.toml', tmp_path/'pyproject.toml')
    clean = Path(sys.executable).parent/'nbdev-clean'
    r = subprocess.run([str(clean) if clean.exists() else 'nbdev-clean'], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    nbs = sorted((tmp_path/'nbs').rglob('*.ipynb'))
    assert len(nbs) == len([p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts])
    assert any(p.parent.name == 'tutorials' for p in nbs) and any(p.parent.name == 'study' for p in nbs)
    missing = [p.relative_to(tmp_path/'nbs').as_posix() for p in nbs
               if json.loads(p.read_text()).get('metadata', {}).get('kernelspec', {}).get('name') != 'python3']
    assert not missing, f'no python3 kernelspec after nbdev-clean: {missing}'
