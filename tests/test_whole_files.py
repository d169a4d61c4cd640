"""Every file `fidelity` writes is whole: plotly.js and the figure pages go through a temporary file and a rename, a
full disk names the file and leaves nothing cut, a cut plotly.min.js is replaced, and --out is checked before the
measurement."""
import errno, json
from pathlib import Path
import pytest
import flowgrpo_nb
from flowgrpo_nb import checkpoint
from flowgrpo_nb.checkpoint import CheckpointError
from flowgrpo_nb.study import fidelity_report as fr
from plotly.offline import get_plotlyjs
import warm  # python commands in a warm interpreter (tests/warm.py)

RESULTS = json.loads((Path(flowgrpo_nb.__file__).parent.parent/'results'/'fidelity'/'fidelity.json').read_text())

def full_at(monkeypatch, name:str):
    "The disk fills up when `name` is written (the write raises ENOSPC, as os.write does)."
    write = checkpoint._fsync_write
    def full(path, data):
        if Path(path).name.startswith(f'.tmp-{name}'): raise OSError(errno.ENOSPC, 'No space left on device')
        write(path, data)
    monkeypatch.setattr(checkpoint, '_fsync_write', full)

def test_a_full_disk_at_plotly_js_names_it_and_the_next_run_is_whole(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        full_at(m, 'plotly.min.js')
        with pytest.raises(CheckpointError, match=r"plotly.js .*plotly.min.js: No space left on device"):
            fr._write_report(tmp_path, RESULTS, png=False)
    assert not (tmp_path/'plotly.min.js').exists() and not list(tmp_path.glob('.tmp-*'))
    fr._write_report(tmp_path, RESULTS, png=False)
    assert (tmp_path/'plotly.min.js').read_text() == get_plotlyjs()

def test_a_cut_plotly_js_is_replaced(tmp_path):
    (tmp_path/'plotly.min.js').write_text(get_plotlyjs()[:937_984])  # what a full disk left before
    fr._write_report(tmp_path, RESULTS, png=False)
    assert (tmp_path/'plotly.min.js').read_text() == get_plotlyjs()
    pages = sorted(tmp_path.glob('*.html'))
    assert pages and all('src="plotly.min.js"' in p.read_text() and p.read_text().rstrip().endswith('</html>')
                         for p in pages)

def test_a_full_disk_at_a_figure_page_names_it(tmp_path, monkeypatch):
    full_at(monkeypatch, 'overall.html')
    with pytest.raises(CheckpointError, match=r"overall.html: No space left on device"):
        fr._write_report(tmp_path, RESULTS, png=False)
    assert not (tmp_path/'overall.html').exists() and not list(tmp_path.glob('.tmp-*'))

def test_out_is_checked_before_the_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(fr, 'arm_fidelity', lambda *a, **k: pytest.fail('measured before --out was checked'))
    (f := tmp_path/'f').write_text('')
    with pytest.raises(ValueError, match='is a file'): fr.fidelity_report(f, fr.FidelityConfig(prompts=2))
    with pytest.raises(ValueError, match='is a file'): fr.fidelity_report(f/'sub', fr.FidelityConfig(prompts=2))

def test_train_score_checks_out_before_training_and_writes_whole(tmp_path, monkeypatch):
    import subprocess, sys
    from flowgrpo_nb.score import save_score, load_score
    root = Path(flowgrpo_nb.__file__).parent.parent
    (f := tmp_path/'file').write_text('')
    for out, says in [(tmp_path, 'is a folder'), (f/'score.safetensors', 'is a file')]:
        r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train-score', '--out', str(out)], cwd=root,
                     capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and says in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]
    model = load_score()
    save_score(model, tmp_path/'s.safetensors', {'n': 1})
    before = (tmp_path/'s.safetensors').read_bytes()
    full_at(monkeypatch, 's.safetensors')
    with pytest.raises(CheckpointError, match=r"the score weights .*s.safetensors: No space left on device"):
        save_score(model, tmp_path/'s.safetensors', {'n': 2})
    assert (tmp_path/'s.safetensors').read_bytes() == before and not list(tmp_path.glob('.tmp-*'))
