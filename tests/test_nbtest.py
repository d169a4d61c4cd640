"""tools/nbtest.py, the notebook stage of tools/check.py: each notebook runs in a child process of its own, with the
project's skip flags and `--flags`, and a failing cell fails its notebook with the cell's error in the output."""
import importlib.util, json, os, shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _nbtest():
    spec = importlib.util.spec_from_file_location('nbtest', ROOT/'tools'/'nbtest.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def _notebook(path:Path, *sources:str):
    cells = [dict(cell_type='code', id=f'c{i}', metadata={}, outputs=[], execution_count=None, source=s)
             for i, s in enumerate(sources)]
    path.write_text(json.dumps(dict(cells=cells, metadata={}, nbformat=4, nbformat_minor=5)))
    return path


def test_each_notebook_in_a_process_of_its_own(tmp_path):
    shutil.copy(ROOT/'pyproject.toml', tmp_path/'pyproject.toml')  # the project's nbdev settings (skip flags)
    (tmp_path/'nbs').mkdir()
    pid = "import os, pathlib\npathlib.Path('{}.pid').write_text(str(os.getpid()))"
    nbs = [_notebook(tmp_path/'nbs'/'a.ipynb', pid.format('a'), "#| slow\nraise ValueError('a slow cell ran')"),
           _notebook(tmp_path/'nbs'/'b.ipynb', pid.format('b'), "#| chrome\npathlib.Path('chrome').touch()"),
           _notebook(tmp_path/'nbs'/'c.ipynb', "print('before')\nraise ValueError('this cell fails')")]
    res = {Path(nb).name: (ok, out) for nb, ok, _, out in _nbtest().run_all(nbs, 'chrome', workers=2)}
    assert res['a.ipynb'][0] and res['b.ipynb'][0], res  # the slow cell skipped
    assert not res['c.ipynb'][0] and 'this cell fails' in res['c.ipynb'][1], res
    pids = {int((tmp_path/'nbs'/f'{n}.pid').read_text()) for n in 'ab'}
    assert len(pids) == 2 and os.getpid() not in pids  # a child per notebook
    assert (tmp_path/'nbs'/'chrome').exists()  # --flags chrome ran the chrome cell
