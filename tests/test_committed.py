"What committed files record: no path of the machine that wrote them; every claim read over seeds and over prompts."
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
    f = ['/srv', '/scratch']  # folders of some machine (this file must not name this one's)
    test = absolute_paths('"command": "flowgrpo compare --out /srv/credit", "c": "x/srv/y", "d": "~/srv/z"', f)
    assert test == ['/srv/credit']
    assert absolute_paths('"checkpoint": "checkpoints/ckpt-000100", "compare": ".."', f) == []
    assert absolute_paths("--json /scratch/phases.json", f) == ['/scratch/phases.json']

def test_no_committed_file_names_a_folder_of_this_machine():
    folders = machine_folders()
    ere = r'(^|[^A-Za-z0-9_.~/-])(' + '|'.join(re.escape(f) for f in folders) + ')/'
    # git grep reads the tracked files (text only, -I) quickly; each file it names is read again here
    hits = subprocess.run(['git', '-C', str(ROOT), 'grep', '-I', '-l', '-E', ere], capture_output=True, text=True)
    assert hits.returncode in (0, 1), hits.stderr
    bad = {f: found[:2] for f in hits.stdout.split() if (found := absolute_paths((ROOT/f).read_text(), folders))}
    assert not bad, f"{len(bad)} committed files name a folder of this machine ({', '.join(folders)}): {bad}"

def claims(name:str) -> list:
    "The claims that ran in results/`name`/report.json, read back as the report reads them."
    from flowgrpo_nb.study.results import Report
    rep = Report.from_json(json.loads((ROOT/'results'/name/'report.json').read_text()))
    return [c for c in rep.contrasts if c.n]

@pytest.mark.parametrize('name', ['confirm', 'credit'])
def test_every_claim_has_both_intervals_and_its_largest_prompt_share(name):
    ran = claims(name)
    assert len(ran) >= 14
    for c in ran:
        assert c.ci[0] <= c.mean <= c.ci[1], c.id  # over seeds
        assert c.prompts_from, c.id  # how the prompts' variance was had, or why it was not
        if c.prompts_from.startswith('none'):  # credit's learned score: no per-prompt result was logged
            assert name == 'credit' and c.task == 'score' and c.ci_prompts is None, c.id
            continue
        assert c.ci_prompts[0] <= c.mean <= c.ci_prompts[1], c.id  # over seeds and held-out prompts
        p, share = c.prompt_shares['largest']
        assert isinstance(p, str) and abs(share) >= max(abs(v) for v in c.prompt_shares['prompts'].values()) - 1e-12
    if name == 'confirm':  # post hoc, from seed 2002's re-evaluated adapters: every claim, widened, said so
        assert all(c.prompts_from.startswith('post hoc') for c in ran)
        assert all(c.ci_prompts[0] <= c.ci[0] and c.ci_prompts[1] >= c.ci[1] for c in ran)

def test_confirm_prompt_interval_recomputes():
    "D1's seeds-and-prompts interval from its seed-only one and seed 2002's per-prompt re-evaluation, by hand."
    from flowgrpo_nb.study.compare import heldout_prompts
    from flowgrpo_nb.study.stats import component_diffs, prompt_variance, widened_ci
    rep = json.loads((ROOT/'results'/'confirm'/'report.json').read_text())
    comp = json.loads((ROOT/'results'/'confirm'/'runs'/'prompt_component.json').read_text())
    names, strata = heldout_prompts(rep['setup'], 'geneval')
    c = next(c for c in rep['contrasts'] if c['id'] == 'D1')
    d, w = component_diffs(comp['arms'], c['arm'], c['other'], names)
    want = widened_ci(c['mean'], c['ci'], c['sd'], c['n'], prompt_variance(d, w, strata))
    assert want == pytest.approx(c['ci_prompts'], abs=1e-12)
    assert comp['seed'] == 2002 and set(comp['arms']) >= {c['arm'], c['other']}
