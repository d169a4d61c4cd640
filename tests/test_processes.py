"PNG export in one kaleido child: bounded in time, retried, and leaving no process or folder behind."
import sys
import pytest


# ---------------------------------------------------------------- PNG export: bounded, no stray processes

# Run in a fresh interpreter that makes itself a child subreaper: any process write_png starts, even one whose parent
# died (an orphaned Chromium), is re-parented to it instead of to init, so "no descendant alive afterwards" is complete.
_NO_STRAYS = r'''
import ctypes, json, os, sys, time, warnings
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
import plotly.graph_objects as go
from flowgrpo_nb.processes import write_png
fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 0, 2])).update_layout(width=400, height=300)
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    ok = write_png(fig, sys.argv[1], timeout=float(sys.argv[2]), tries=int(sys.argv[3]))
sec = time.monotonic() - t0
def descendants():
    procs = {}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try: f = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
        except OSError: continue
        procs[int(p)] = (f[0], int(f[1]))
    me, out, frontier = os.getpid(), [], {os.getpid()}
    while frontier:
        frontier = {p for p, (st, pp) in procs.items() if pp in frontier}
        out += [(p, procs[p][0]) for p in frontier]
    return [p for p, st in out if st not in 'ZX']
time.sleep(0.5)  # a leak would still be alive after this; a clean exit is long reaped
print(json.dumps(dict(ok=ok, sec=sec, alive=descendants(), warnings=[str(m.message) for m in w])))
'''


def _write_png_in_subreaper(path, timeout, tries):
    import json, subprocess, sys
    r = subprocess.run([sys.executable, '-c', _NO_STRAYS, str(path), str(timeout), str(tries)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='uses /proc and prctl')
def test_write_png_leaves_no_process_behind(tmp_path):
    r = _write_png_in_subreaper(tmp_path/'ok.png', 60, tries=2)
    assert r['ok'] and r['warnings'] == [], r
    assert (tmp_path/'ok.png').read_bytes()[:4] == b'\x89PNG'
    assert r['alive'] == []


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='uses /proc and prctl')
def test_write_png_timeout_returns_quickly_with_a_message(tmp_path):
    r = _write_png_in_subreaper(tmp_path/'hung.png', 0.3, tries=1)
    assert not r['ok'] and not (tmp_path/'hung.png').exists()
    assert r['sec'] < 5, r
    assert (len(r['warnings']) == 1 and 'hung.png: PNG skipped' in r['warnings'][0]
            and 'did not finish in 0.3 s' in r['warnings'][0])
    assert r['alive'] == []


def test_write_png_failure_is_retried_then_a_warning(tmp_path, monkeypatch):
    import plotly.graph_objects as go
    import flowgrpo_nb.processes as processes
    (tmp_path/'count').write_text('')
    child = f"import sys; open({str(tmp_path/'count')!r}, 'a').write('x'); sys.exit('kaleido: no renderer')"
    monkeypatch.setattr(processes, '_PNG_CHILD', child)
    monkeypatch.setattr(processes, 'find_browser', lambda: 'a browser')  # the fake child needs none
    with pytest.warns(UserWarning,
                      match=r'bad.png: PNG skipped: the export failed \(kaleido: no renderer\) \(2 tries\)'):
        assert processes.write_png(go.Figure(), tmp_path/'bad.png') is False
    assert (tmp_path/'count').read_text() == 'xx' and not (tmp_path/'bad.png').exists()
    with pytest.raises(ValueError, match='tries=0'): processes.write_png(go.Figure(), tmp_path/'bad.png', tries=0)


def test_write_pngs_keeps_what_a_failed_try_finished_and_retries_only_the_rest(tmp_path, monkeypatch):
    import plotly.graph_objects as go
    import flowgrpo_nb.processes as processes
    log = tmp_path/'tries'
    child = (f"import json, sys; from pathlib import Path; items = json.loads(Path(sys.argv[1]).read_text()); "
             f"open({str(log)!r}, 'a').write(f'{{len(items)}} '); "
             "[Path(o).write_bytes(b'\\x89PNG first') for s, o in items if o.endswith('0.png')]; "
             "sys.exit('kaleido: the second one fails')")
    monkeypatch.setattr(processes, '_PNG_CHILD', child)
    monkeypatch.setattr(processes, 'find_browser', lambda: 'a browser')
    a, b = tmp_path/'a.png', tmp_path/'b.png'
    with pytest.warns(UserWarning, match=r'b.png: PNG skipped: the export failed \(kaleido: the second one fails\) '
                                         r'\(2 tries\)') as w:
        assert processes.write_pngs({a: go.Figure(), b: go.Figure()}) == {a: True, b: False}
    assert log.read_text() == '2 1 ' and a.read_bytes() == b'\x89PNG first' and not b.exists()  # the second try: only b
    assert len([m for m in w if 'PNG skipped' in str(m.message)]) == 1


_NOTICE = 'requires torchvision'
_IN_WORKERS = r'''
from concurrent.futures import ProcessPoolExecutor
from flowgrpo_nb.study.pool import worker_context
if __name__ == '__main__':
    with ProcessPoolExecutor(1, mp_context=worker_context()) as ex: ex.submit(exec, 'import flowgrpo_nb.sd3').result()
    import flowgrpo_nb.sd3
'''

def test_the_package_drops_the_torchvision_notice_in_its_processes_and_workers(tmp_path):
    """transformers prints its torchvision notice on a plain import of a diffusers pipeline; not in a process of the
    package, nor in its workers."""
    import subprocess
    plain = subprocess.run([sys.executable, '-c', 'from diffusers import StableDiffusion3Pipeline'],
                           capture_output=True, text=True, timeout=300)
    if _NOTICE not in plain.stderr:
        pytest.skip('this transformers prints no torchvision notice (torchvision installed?)')
    (tmp_path/'job.py').write_text(_IN_WORKERS)
    r = subprocess.run([sys.executable, str(tmp_path/'job.py')], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _NOTICE not in r.stderr, r.stderr[-2000:]


# A command killed outright (SIGKILL) in the middle of an export: the export's child dies with it (parent-death signal),
# its browser with the child, and the next export removes the temporary folder nobody could remove.
_KILLED_MID_EXPORT = r'''
import ctypes, json, os, signal, subprocess, sys, time
# PR_SET_CHILD_SUBREAPER: orphans of the killed command stay visible here
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
import psutil
cmd = subprocess.Popen([sys.executable, '-c', "import plotly.graph_objects as go, sys; "
                        "from flowgrpo_nb.processes import write_png; "
                        "write_png(go.Figure(go.Bar(y=[1, 2])), sys.argv[1], timeout=300)", sys.argv[1]])
t0 = time.monotonic()
def tree():
    "The names of the living processes below this one; one that ends while being looked at is gone, not an error."
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE: out.append(p.name())
        except psutil.Error: pass
    return out
while not any('chrom' in n.lower() for n in tree()):  # the browser is up: the export is under way
    assert time.monotonic() - t0 < 200, 'no browser started'
    time.sleep(0.05)
had = len(tree())
cmd.kill(); cmd.wait(); t1 = time.monotonic()
while tree() and time.monotonic() - t1 < 10: time.sleep(0.1)
print(json.dumps(dict(pid=cmd.pid, had=had, left=tree(), sec=time.monotonic() - t1)))
'''

@pytest.mark.chrome
@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='uses prctl')
def test_a_command_killed_mid_export_leaves_no_process_and_its_folder_is_swept(tmp_path):
    import json, subprocess, tempfile
    from pathlib import Path
    from flowgrpo_nb.processes import _sweep_png_folders
    r = subprocess.run([sys.executable, '-c', _KILLED_MID_EXPORT, str(tmp_path/'k.png')], capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d['had'] >= 2 and d['left'] == [] and d['sec'] < 10, d  # the child and its browser were there, and are gone
    left = list(Path(tempfile.gettempdir()).glob(f"flowgrpo-png-{d['pid']}-*"))
    assert left, 'the killed command left its folder (nothing of it could remove it)'
    _sweep_png_folders()
    assert not any(p.exists() for p in left)


def test_without_kaleido_1_the_png_warning_says_to_install_it(tmp_path, monkeypatch):
    import importlib.metadata, plotly.graph_objects as go
    import flowgrpo_nb.processes as processes
    monkeypatch.setattr(processes, 'find_browser', lambda: None)
    # an environment made before the package needed kaleido 1.x
    monkeypatch.setattr(importlib.metadata, 'version', lambda name: '0.2.1')
    with pytest.warns(UserWarning, match=r"a.png: PNG skipped: this environment has kaleido 0.2.1; PNGs need kaleido "
                                         r"1.x: pip install 'kaleido>=1.1,<2'"):
        assert processes.write_png(go.Figure(), tmp_path/'a.png') is False
    monkeypatch.setattr(importlib.metadata, 'version', lambda name: '1.5.1')
    with pytest.warns(UserWarning, match=r'a.png: PNG skipped: kaleido needs Chrome or Chromium and none was found'):
        assert processes.write_png(go.Figure(), tmp_path/'a.png') is False
    assert not (tmp_path/'a.png').exists()
